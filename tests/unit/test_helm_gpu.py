"""The chart's GPU value set (ci/gpu-production.yaml): SGLang engines that start as SGLang behaves, each pool
its own model from one shared volume, counted with its own tokenizer; the models Job that fills the volume."""

from __future__ import annotations

import json
from pathlib import Path

from .test_helm import CHART, engine_of, of_kind, rendered


def test_the_gpu_pools_request_a_gpu_and_the_cpu_pools_run_llama_cpp():
    for values, engine in (("gpu-production", "sglang"), ("cpu-demo", "llama.cpp")):
        for deployment in of_kind(values, "Deployment"):
            if not deployment["metadata"]["name"].startswith("rel-parley-inference-"):
                continue
            containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
            assert engine in containers["engine"]["image"]
            limits = containers["engine"]["resources"].get("limits", {})
            assert ("nvidia.com/gpu" in limits) == (engine == "sglang")


def test_the_gpu_engine_starts_as_sglang_behaves():
    for deployment in of_kind("gpu-production", "Deployment"):
        containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
        if "engine" not in containers:
            continue
        engine = containers["engine"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if "exec" in engine[probe]:  # an engine on its pod's loopback, checked from inside
                check = engine[probe]["exec"]["command"][-1]
                own = float(check.split("timeout=")[1].rstrip(")"))
            else:  # the guard model, reached over the network
                own = 5.0 if probe == "livenessProbe" else 10.0
            assert engine[probe]["timeoutSeconds"] > own, probe  # the default 1 s never passes /health
        live = engine["livenessProbe"]
        assert "/ready" in (live["exec"]["command"][-1] if "exec" in live else live["httpGet"]["path"])
        env = {e["name"]: e["value"] for e in engine["env"]}
        mounts = {m["mountPath"] for m in engine["volumeMounts"]}
        assert env["HOME"] in mounts and env["TRITON_CACHE_DIR"].startswith(env["HOME"])  # writable, non-root
        args = engine["args"]
        if deployment["metadata"]["name"].endswith("-guard"):
            continue  # a check, not a run: no tier to order
        assert "--enable-priority-scheduling" in args  # the consumer sends each run's priority
        assert args[args.index("--default-priority-value") + 1] == "0"
        # tool_choice auto: the engine parses the model's own call syntax into tool_calls (inference/calls.py)
        assert args[args.index("--tool-call-parser") + 1] == "llama3"


def test_each_gpu_pool_serves_its_own_model_from_one_shared_volume_counted_with_its_own_tokenizer():
    """The catalogue of ci/gpu-production.yaml: an 8B on one GPU and a 70B over four. One read-many volume is
    filled once by the models Job (with the Hugging Face token from a Secret); each engine loads its pool's model
    from it with the pool's tensor-parallel size and as many GPUs; the edge and the stages count each pool's
    tokens with that model's tokenizer from the same volume, and every pod waits for what it reads."""
    docs = rendered("gpu-production")
    [claim] = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    [fetch] = [
        j for j in of_kind("gpu-production", "Job") if "helm.sh/hook" not in j["metadata"].get("annotations", {})
    ]
    pod = fetch["spec"]["template"]["spec"]
    [fetcher] = pod["containers"]
    models = ["meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.3-70B-Instruct"]
    assert fetcher["args"] == sorted([*models, "meta-llama/Llama-Guard-3-8B"])  # and the guard model's
    token = next(e for e in fetcher["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "huggingface", "key": "HF_TOKEN"}
    assert {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v} == {
        claim["metadata"]["name"]
    }
    folder = {m: "/models/" + m.replace("/", "--") for m in models}
    want = {"small": (models[0], 1, "llama-3.1-8b-instruct"), "large": (models[1], 4, "llama-3.3-70b-instruct")}
    for deployment in of_kind("gpu-production", "Deployment"):
        name = deployment["metadata"]["name"].removeprefix("rel-parley-")
        spec = deployment["spec"]["template"]["spec"]
        claims = {
            v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"].get("readOnly")
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v
        }
        if name in ("registry", "guard"):
            continue
        assert claims == {claim["metadata"]["name"]: True}, name
        [wait] = spec["initContainers"]
        if name.startswith("inference-"):
            model, tp, served = want[name.removeprefix("inference-")]
            args = engine_of(deployment)["args"]
            assert args[args.index("--model-path") + 1] == folder[model]
            assert args[args.index("--tp-size") + 1] == str(tp)
            assert args[args.index("--served-model-name") + 1] == served
            assert engine_of(deployment)["resources"]["limits"]["nvidia.com/gpu"] == tp
            assert wait["args"] == [f"{folder[model]}/.weights-ready"]
        else:
            every = sorted([*models, "meta-llama/Llama-Guard-3-8B"])
            assert wait["args"] == [f"/models/{m.replace('/', '--')}/.tokenizer-ready" for m in every], name
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        pools = json.loads(env["PARLEY_POOLS"])
        assert {p: pools[p]["tokenizer"] for p in pools} == {p: f"hf:{folder[m]}" for p, (m, _, _) in want.items()}
        assert {p: pools[p]["model"] for p in pools} == {p: served for p, (_, _, served) in want.items()}
    assert not [
        d
        for d in rendered("cpu-demo")
        if d["kind"] in ("PersistentVolumeClaim", "Job") and "models" in d["metadata"]["name"]
    ]


def test_the_models_job_fetches_tokenizers_before_any_weights_and_resumes(tmp_path, monkeypatch):
    """files/fetch_models.py, run as the Job runs it, against a stand-in for the Hugging Face Hub (none is
    reachable here): every tokenizer is marked ready before any weights are fetched, and a rerun fetches only
    what is not marked yet."""
    import runpy
    import sys
    import types

    fetched = []

    def snapshot_download(repo, local_dir, allow_patterns=None):
        fetched.append((repo, "tokenizer" if allow_patterns else "weights"))
        Path(local_dir).mkdir(parents=True, exist_ok=True)

    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=snapshot_download))
    main = runpy.run_path(str(CHART / "files/fetch_models.py"))["main"]
    main(["org/a", "org/b"], tmp_path)
    assert fetched == [("org/a", "tokenizer"), ("org/b", "tokenizer"), ("org/a", "weights"), ("org/b", "weights")]
    assert (tmp_path / "org--a/.weights-ready").exists() and (tmp_path / "org--b/.tokenizer-ready").exists()
    (tmp_path / "org--b/.weights-ready").unlink()
    fetched.clear()
    main(["org/a", "org/b"], tmp_path)
    assert fetched == [("org/b", "weights")]


def test_the_guard_model_is_served_on_its_own_gpus_and_every_checker_asks_it():
    """guard.serve: Llama Guard on SGLang from the models volume, behind a Service only Parley's pods reach;
    the moderation stage, the scheduler and the inference consumers are pointed at it (safety/guard_model.py)."""
    docs = rendered("gpu-production")
    [guard] = [d for d in of_kind("gpu-production", "Deployment") if d["metadata"]["name"] == "rel-parley-guard"]
    engine = engine_of(guard)
    args = engine["args"]
    assert args[args.index("--model-path") + 1] == "/models/meta-llama--Llama-Guard-3-8B"
    assert args[args.index("--served-model-name") + 1] == "llama-guard-3-8b"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    [service] = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "rel-parley-guard"]
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-internal")]
    [allowed] = policy["spec"]["podSelector"]["matchExpressions"][1:]
    assert "guard" in allowed["values"] and {"port": 30000, "protocol": "TCP"} in policy["spec"]["ingress"][0]["ports"]
    for name in ("moderation", "scheduling", "inference-small", "inference-large"):
        [d] = [d for d in of_kind("gpu-production", "Deployment") if d["metadata"]["name"] == f"rel-parley-{name}"]
        env = {e["name"]: e for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        port = service["spec"]["ports"][0]["port"]
        assert env["PARLEY_GUARD_URL"]["value"] == f"http://{service['metadata']['name']}:{port}", name
        assert env["PARLEY_GUARD_MODEL"]["value"] == "llama-guard-3-8b"
        assert env["PARLEY_GUARD_API_KEY"]["valueFrom"]["secretKeyRef"]["optional"] is True
    cpu = [
        e["name"]
        for d in of_kind("cpu-demo", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
    ]
    assert "PARLEY_GUARD_URL" not in cpu  # off by default: the embedded encoder judges


def test_a_gpu_consumer_has_the_cpus_its_output_checks_need():
    """64 streams checked every 32 tokens at ~30 ms a check is more than one CPU's work: the consumer beside an
    SGLang engine asks for four CPUs and runs as many checks at once (bench/results/output_check_load.json)."""
    for values, cpus in (("gpu-production", "4"), ("cpu-demo", "250m")):
        for d in of_kind(values, "Deployment"):
            if not d["metadata"]["name"].startswith("rel-parley-inference-"):
                continue
            consumer = d["spec"]["template"]["spec"]["containers"][0]
            assert consumer["resources"]["requests"]["cpu"] == cpus
            env = {e["name"]: e.get("value") for e in consumer["env"]}
            assert env.get("PARLEY_MODERATION_WORKERS") == ("4" if values == "gpu-production" else None)
