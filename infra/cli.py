"""`parley`: bring the local stack up or down, mint credentials for it, reconcile metered usage, and read the
log: inspect a run, replay recorded runs under a candidate, run evals, export rated answers."""

from __future__ import annotations

import argparse
import getpass
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from infra.stack import CLUSTER, SINGLE_NODE, Stack
from replay import OUTCOMES

if TYPE_CHECKING:
    from replay.candidate import Candidate
from topics.settings import StackSettings


def workers(text: str) -> dict[str, int]:
    """'small=2,large=1' -> {'small': 2, 'large': 1}"""
    from topics.pipeline import POOLS

    found: dict[str, int] = {}
    for part in text.split(","):
        pool, _, count = part.partition("=")
        if pool not in POOLS or not count.isdigit():
            raise argparse.ArgumentTypeError(f"expected pool=count with a pool in {POOLS}, got {part!r}")
        found[pool] = int(count)
    return found


def _stack(args: argparse.Namespace) -> Stack:
    """The stack the arguments name. A cluster runs two edge replicas and two consumers per pool unless told."""
    cluster = args.cluster
    workers = getattr(args, "workers", None)  # commands that start nothing (topics) do not take the sizes
    return Stack(
        namespace=args.namespace,
        port_base=args.port_base,
        replicas=getattr(args, "replicas", 0) or (2 if cluster else 1),
        stages=getattr(args, "stages", 1),
        workers=workers or ({"small": 2, "large": 2} if cluster else {"small": 1, "large": 1}),
        topology=CLUSTER if cluster else SINGLE_NODE,
    )


def cmd_token(args: argparse.Namespace) -> None:
    from api.auth import credential

    print(credential(args.user, args.tier, args.ttl, args.admin))


def sign_in_links(api_url: str) -> str:
    """Links that open the chat app (and the usage dashboard) signed in as the local user, for 30 days."""
    from api.auth import credential

    user = getpass.getuser() or "you"
    chat = credential(user, "pro", 30 * 86_400)
    dashboard = credential(user, "pro", 30 * 86_400, admin=True)
    return (
        f"  chat (signed in as {user}): {api_url}/#token={chat}\n"
        f"  usage dashboard (admin):  {api_url}/dashboard#token={dashboard}"
    )


def cmd_up(args: argparse.Namespace) -> None:
    stack = _stack(args)
    stack.up()
    print(f"Parley is up: {stack.api_url}  (timings: {stack.timings})\n{sign_in_links(stack.api_url)}", flush=True)


def cmd_run(args: argparse.Namespace) -> None:
    stack = _stack(args)
    stopping = False

    def interrupt(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # `make run | tee` must not stop us before we clean up
    signal.signal(signal.SIGHUP, interrupt)  # a closed terminal stops the stack cleanly too
    try:
        stack.up()
        _say(
            f"\nParley is running at {stack.api_url}\n"
            f"{sign_in_links(stack.api_url)}\n"
            f"  another credential: .venv/bin/parley token --user alice --tier pro\n"
            f"  logs:              {stack.state}/logs/{stack.tag}/\n"
            f"Press Ctrl-C to stop everything."
        )
        while not stopping:
            if len(stack.pids()) < len(stack.services()):
                _say("a stage exited; see the logs. Stopping.")
                break
            time.sleep(1)
    finally:
        _say("stopping...")
        stack.down()
        _say("stopped.")


def _say(text: str) -> None:
    """Print, but never let a closed terminal or pipe interrupt start-up or shutdown."""
    try:
        print(text, flush=True)
    except OSError:
        pass


def cmd_down(args: argparse.Namespace) -> None:
    _stack(args).down() if not args.keep_services else _stack(args).stop()


def cmd_status(args: argparse.Namespace) -> None:
    import json

    rows = _stack(args).status()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        state = f"running pid {row['pid']}" if row["pid"] else "stopped"
        print(f"{row['name']:24} {row['role']:15} {row['address']:18} {state}")


def cmd_topics(args: argparse.Namespace) -> None:
    """Create the pipeline's topics, or grow their partitions, from the settings (PARLEY_* or the stack's)."""
    import json

    from topics.kafka import ensure_topics, grow_topics

    stack = _stack(args)
    settings = stack.settings.model_copy(
        update={k: v for k, v in (("chat_partitions", args.chat), ("reply_partitions", args.reply)) if v}
    )
    if args.topics_command == "grow":
        grown = grow_topics(settings.kafka_bootstrap, settings.namespace, settings.layout)
        print(json.dumps({"grown": grown}, indent=2))
        print("restart the stages, consumers and edges one at a time to read the new partitions now", file=sys.stderr)
    else:
        print(json.dumps({"created": ensure_topics(settings.kafka_bootstrap, settings.namespace, settings.layout)}))


def moment(text: str, now_ms: int) -> int:
    """'2026-11-21T10:00' (UTC unless it says), '90m' / '24h' / '7d' ago, 'now', or epoch milliseconds."""
    from datetime import UTC, datetime

    units = {"m": 60_000, "h": 3_600_000, "d": 86_400_000}
    if text == "now":
        return now_ms
    if text.isdigit():
        return int(text)
    if text[:-1].isdigit() and text[-1] in units:
        return now_ms - int(text[:-1]) * units[text[-1]]
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (ISO 8601, 24h/7d ago, now, or epoch ms)") from exc
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)


def cmd_reconcile(args: argparse.Namespace) -> None:
    import json
    import os

    from processors.meter_usage import Prices
    from processors.reconcile import reconcile

    now = int(time.time() * 1000)
    since, until = moment(args.since, now), moment(args.until, now)
    settings, metering = _connected(args)
    prices = Prices.load(args.price_table or os.environ.get("PARLEY_PRICE_TABLE", ""))
    drift = reconcile(
        settings.kafka_bootstrap, args.namespace, metering, since, until, prices, args.repair, not args.quiet
    )
    print(json.dumps(drift.summary(), indent=2, default=str))
    if not drift.zero:
        raise SystemExit(2)


def cmd_trace(args: argparse.Namespace) -> None:
    from infra.traces import run_trace, tree

    stack = Stack(namespace=args.namespace, port_base=args.port_base)
    path = Path(args.file) if args.file else stack.spans_file
    lines = tree(run_trace(path, args.run_id))
    if not lines:
        raise SystemExit(f"no span of run {args.run_id} in {path} (spans arrive about a second after they end)")
    print(f"trace of run {args.run_id} (from {path}):\n" + "\n".join(lines))


def _connected(args: argparse.Namespace) -> tuple[StackSettings, str]:
    """The settings, the schema registry connected, and the metering stage's URL: what the commands that read
    the log and the stores need. PARLEY_* where the command runs (a pod on a cluster) decide; the local
    single-node stack's values fill in only what they leave unset. A command's own --bootstrap,
    --registry-url or --metering-url, where it has them, come first."""
    import os

    from registry import client as registry

    stack = Stack(namespace=args.namespace, port_base=args.port_base)
    local = {k: v for k, v in stack.topology.settings().items() if f"PARLEY_{k.upper()}" not in os.environ}
    url = getattr(args, "registry_url", "") or os.environ.get("PARLEY_SCHEMA_REGISTRY_URL") or stack.registry_url
    registry.connect(url)
    stage = next(s for s in stack.services() if s.name == "metering")  # the local stack's metering stage
    metering = (
        getattr(args, "metering_url", "") or os.environ.get("PARLEY_METERING_URL") or f"http://127.0.0.1:{stage.port}"
    )
    update: dict[str, object] = {**local, "namespace": args.namespace, "schema_registry_url": url}
    if getattr(args, "bootstrap", ""):
        update["kafka_bootstrap"] = args.bootstrap
    return StackSettings().model_copy(update=update), metering


def cmd_runs_show(args: argparse.Namespace) -> None:
    import json

    from replay import runs
    from topics.window import Window

    settings, metering = _connected(args)
    try:
        runs.minted_ms(args.run_id)
        with Window(settings.kafka_bootstrap, settings.namespace) as window:
            history = runs.find(window, args.run_id)
    except (ValueError, LookupError) as exc:
        raise SystemExit(f"parley runs show: {exc}") from None
    if not args.no_stored:
        history.stored = runs.stored(history, settings, metering)
    print(json.dumps(history.as_json(), indent=2, default=str) if args.json else runs.text(history))


def candidate_of(args: argparse.Namespace) -> Candidate:
    """The candidate configuration the replay arguments name."""
    from replay import candidate as cand

    settings = dict(cand.setting(text) for text in args.set)
    if args.system_prompt is not None:
        settings["system_prompt"] = args.system_prompt
    model = args.model
    if args.pool:
        pools = StackSettings().pools
        if args.pool not in pools:
            raise cand.CandidateError(f"--pool is one of {', '.join(pools)}")
        model = pools[args.pool].model
    through = args.through or (
        "pipeline"
        if settings or model or args.limits or args.max_tokens or args.temperature is not None
        else "moderation"
    )
    return cand.Candidate(
        through=through,
        policy=cand.load_policy(args.policy) if args.policy else None,
        limits=cand.load_limits(args.limits) if args.limits else None,
        settings=settings,
        model=model,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
    )


def cmd_replay(args: argparse.Namespace) -> None:
    import json

    from replay import candidate as cand
    from replay import redrive, report
    from topics.window import Window

    settings, _ = _connected(args)
    now = int(time.time() * 1000)
    plan = None
    try:
        if args.resume:
            plan = redrive.Plan.load(args.resume)
            with Window(settings.kafka_bootstrap, plan.production) as window:
                runs = redrive.recorded_again(window, plan)
        else:
            candidate = candidate_of(args)
            selection = redrive.Selection(
                runs=tuple(args.run),
                chat=args.chat,
                user=args.user,
                since_ms=moment(args.since, now),
                until_ms=moment(args.until, now),
                outcome=args.outcome,
                feedback=args.feedback,
                limit=args.limit,
            )
            with Window(settings.kafka_bootstrap, settings.namespace) as window:
                runs = redrive.select(window, selection)
            if not runs:
                raise redrive.ReplayError("no recorded run matches the selection (check the range and filters)")
            plan = redrive.new_plan(settings, candidate, selection, runs)
            print(f"replay {plan.id}: {len(runs)} runs (resume with --resume {plan.id})", file=sys.stderr)
        found = redrive.Replay(plan, settings, progress=not args.quiet).run(runs, keep=args.keep)
    except (redrive.ReplayError, cand.CandidateError, ValueError, LookupError) as exc:
        raise SystemExit(f"parley replay: {exc}") from None
    except KeyboardInterrupt:
        resume = f" Resume with: parley replay --resume {plan.id}" if plan else ""
        raise SystemExit(f"interrupted; production is untouched.{resume}") from None
    if args.html:
        Path(args.html).write_text(report.html(found))
        print(f"report: {args.html}", file=sys.stderr)
    print(json.dumps(found, indent=2, default=str) if args.json else report.text(found))
    if found["missing"]:
        raise SystemExit(f"{len(found['missing'])} runs got no result; resume with --resume {found['replay_id']}")


def cmd_eval_run(args: argparse.Namespace) -> None:
    import json
    import uuid

    import httpx

    from replay import candidate as cand
    from replay import evals
    from replay.redrive import free_port_base
    from topics.window import Window

    settings, metering = _connected(args)
    try:
        suites = [evals.load(path) for path in args.suite]
        policy = cand.load_policy(args.policy) if args.policy else None
    except (evals.SuiteError, cand.CandidateError) as exc:
        raise SystemExit(f"parley eval: {exc}") from None
    from api.auth import credential

    label = args.label or evals.new_label()
    token = args.token or credential(f"eval-{label}", args.tier, 24 * 3600)
    url, namespace, stack = args.url or Stack(port_base=args.port_base).api_url, settings.namespace, None
    since = int(time.time() * 1000)
    results = []
    try:
        if policy is not None:
            # Under a candidate policy the suite runs through a pipeline of its own (edge included), in a
            # namespace of its own: production's policy is never changed for an eval.
            candidate = cand.Candidate(through="pipeline", policy=policy)
            namespace = f"{settings.namespace or 'parley'}-eval-{uuid.uuid4().hex[:8]}"
            cand.prepare(settings, namespace, candidate, {}, set())
            stack = cand.processes(settings, namespace, candidate, free_port_base(), serving=True)
            stack.start()
            stack.wait_ready()
            url = stack.api_url
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as client:
            for suite in suites:
                results += evals.run_suite(suite, label, client, progress=not args.quiet, model=args.model)
        with Window(settings.kafka_bootstrap, namespace) as window:
            evals.add_verdicts(window, results, since)
    finally:
        if stack is not None:
            stack.stop()
            cand.drop(settings, namespace, keyspace=True)
    written = evals.Store(metering, settings.internal_headers()).write(results)
    if args.json:
        print(json.dumps({"label": label, "stored": written, "results": [r.row() for r in results]}, indent=2))
        return
    for r in results:
        failed = [name for name, ok in r.checks.items() if not ok]
        said = "pass" if r.passed else f"FAIL {','.join(failed) or r.turn.error}"
        print(f"{r.suite:12} {r.case:32} {said:28} {r.turn.answer[:50]!r}")
    passed = sum(r.passed for r in results)
    print(f"label {label}: {passed}/{len(results)} passed, {written} rows in eval_results")


def cmd_eval_compare(args: argparse.Namespace) -> None:
    import json

    from replay import evals

    settings, metering = _connected(args)
    store = evals.Store(metering, settings.internal_headers())
    a, b = store.rows(args.a), store.rows(args.b)
    for label, rows in ((args.a, a), (args.b, b)):
        if not rows:
            raise SystemExit(f"parley eval compare: no results under label {label!r}")
    report = evals.compare(a, b, args.a, args.b)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    rates = report["pass_rate"]
    print(f"{report['cases']} cases in both: {args.a} {rates[args.a]}, {args.b} {rates[args.b]}")
    for f in report["flipped"]:
        print(f"  {f['suite']}/{f['case']}: {'pass' if f[args.a] else 'fail'} -> {'pass' if f[args.b] else 'fail'}")
    if not report["flipped"]:
        print("  nothing flipped")


def cmd_export_feedback(args: argparse.Namespace) -> None:
    import json

    from replay import export
    from topics.window import Window

    settings, _ = _connected(args)
    now = int(time.time() * 1000)
    counts = {"rated": 0, "pair": 0}
    with Window(settings.kafka_bootstrap, settings.namespace) as window:
        for line in export.lines(window, moment(args.since, now), moment(args.until, now), args.pairs_only):
            counts[line["type"]] += 1
            print(json.dumps(line, ensure_ascii=False))
    print(f"{counts['rated']} rated answers, {counts['pair']} preference pairs", file=sys.stderr)
    if not any(counts.values()):
        raise SystemExit("parley export: no rated answer in the range")


def _reads_the_stack(parser: argparse.ArgumentParser, fn: Callable[[argparse.Namespace], None]) -> None:
    """The options of a command that reads a stack's log and stores: which namespace, which local stack."""
    parser.add_argument("--namespace", default="", help="topic/keyspace prefix (tests use their own)")
    parser.add_argument("--port-base", type=int, default=8000, help="the local stack's port base")
    parser.set_defaults(fn=fn)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="parley", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    token = sub.add_parser("token", help="print a credential for the local stack")
    token.add_argument("--user", required=True)
    token.add_argument("--tier", choices=("free", "pro", "enterprise"), default="free")
    token.add_argument("--ttl", type=int, default=30 * 24 * 3600, help="seconds until it expires")
    token.add_argument("--admin", action="store_true", help="may change tier and per-user limits")
    token.set_defaults(fn=cmd_token)
    for name, fn, text in (
        ("up", cmd_up, "start everything in the background"),
        ("run", cmd_run, "start everything; Ctrl-C stops it"),
        ("down", cmd_down, "stop everything"),
        ("status", cmd_status, "which processes run"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--namespace", default="", help="topic/keyspace prefix (tests use their own)")
        p.add_argument("--port-base", type=int, default=8000)
        p.add_argument(
            "--cluster",
            action="store_true",
            help="3 Kafka brokers and 3 Cassandra nodes (127.0.0.11-13) keeping 3 copies; 2 edges, 2 consumers a pool",
        )
        p.add_argument("--replicas", type=int, default=0, help="edge replicas (ports base, base+100, ...); default 1")
        p.add_argument("--stages", type=int, default=1, help="replicas of each processor stage")
        p.add_argument(
            "--workers",
            type=workers,
            default=None,
            help="inference consumers per pool, e.g. small=2,large=1 (each with its own engine); default 1 each",
        )
        if name == "down":
            p.add_argument("--keep-services", action="store_true", help="leave Kafka and Cassandra running")
        if name == "status":
            p.add_argument("--json", action="store_true", help="a JSON list: name, role, pid, address, broker_id")
        p.set_defaults(fn=fn)
    topics = sub.add_parser("topics", help="the pipeline's Kafka topics").add_subparsers(
        dest="topics_command", required=True
    )
    for name, text in (
        ("create", "create every topic and dead-letter topic that is missing (partitions and copies from settings)"),
        ("grow", "raise the partition counts of existing topics to --chat / --reply (or the settings')"),
    ):
        p = topics.add_parser(name, help=text)
        p.add_argument("--namespace", default="")
        p.add_argument("--port-base", type=int, default=8000)
        p.add_argument("--cluster", action="store_true", help="the local cluster's brokers")
        p.add_argument("--chat", type=int, default=0, help="partitions of every chat-keyed topic")
        p.add_argument("--reply", type=int, default=0, help="partitions of the reply topics (edge replicas)")
        p.set_defaults(fn=cmd_topics)
    trace = sub.add_parser("trace", help="one run's trace, as the local collector received it, as a tree")
    trace.add_argument("run_id")
    trace.add_argument("--namespace", default="")
    trace.add_argument("--port-base", type=int, default=8000)
    trace.add_argument("--file", default="", help="an OTLP JSON spans file (default: the local stack's)")
    trace.set_defaults(fn=cmd_trace)
    runs = sub.add_parser("runs", help="recorded runs").add_subparsers(dest="runs_command", required=True)
    show = runs.add_parser("show", help="one run's whole history across the topics, in order, and what was stored")
    show.add_argument("run_id")
    show.add_argument("--json", action="store_true", help='{"run_id", "trace_id", "events": [...], "stored": {...}}')
    show.add_argument("--no-stored", action="store_true", help="the log only: skip Cassandra and metering")
    _reads_the_stack(show, cmd_runs_show)
    rp = sub.add_parser(
        "replay",
        help="send recorded runs again through the real moderation stage under a candidate policy, in a "
        "namespace of their own, and report what changes",
    )
    rp.add_argument("--policy", default="", help="a safety policy file (the body of PUT /v1/admin/safety/policies)")
    rp.add_argument("--limits", default="", help='a limits file: {"tiers": {tier: {...}}, "users": {user: {...}}}')
    rp.add_argument("--set", action="append", default=[], help="a stage setting, KEY=VALUE (recall_k=3, pools=...)")
    rp.add_argument("--system-prompt", default=None, help="the system prompt the scheduler puts first")
    rp.add_argument("--model", default=None, help="every prompt asks for this model id")
    rp.add_argument("--pool", default=None, help="every prompt asks for this pool's model")
    rp.add_argument("--temperature", type=float, default=None)
    rp.add_argument("--max-tokens", type=int, default=None)
    rp.add_argument(
        "--through",
        choices=("moderation", "pipeline"),
        default=None,
        help="moderation only, or the whole pipeline (scheduling and inference with engines of its own); "
        "default: moderation for a policy alone, else the pipeline",
    )
    rp.add_argument("--html", default="", help="also write an HTML report with plots here")
    rp.add_argument("--run", action="append", default=[], help="a run id (repeatable)")
    rp.add_argument("--chat", default=None, help="only this chat's runs")
    rp.add_argument("--user", default=None, help="only this user's runs")
    rp.add_argument("--since", default="24h", help="ISO 8601 (UTC unless it says), 90m/24h/7d ago, or epoch ms")
    rp.add_argument("--until", default="now")
    rp.add_argument("--outcome", choices=OUTCOMES, default=None, help="only runs that ended this way")
    rp.add_argument("--feedback", choices=("up", "down"), default=None, help="only runs rated so")
    rp.add_argument("--limit", type=int, default=0, help="at most this many runs (the earliest)")
    rp.add_argument("--resume", default="", help="carry on an interrupted replay by its id")
    rp.add_argument("--keep", action="store_true", help="keep the replay's topics afterwards")
    rp.add_argument("--json", action="store_true", help='{"runs", "changed": [...], "summary": {...}, ...}')
    rp.add_argument("--quiet", action="store_true", help="no progress bar")
    _reads_the_stack(rp, cmd_replay)
    ev = sub.add_parser("eval", help="eval suites through the real pipeline").add_subparsers(
        dest="eval_command", required=True
    )
    er = ev.add_parser("run", help="run suites through the edge; one row per case in ClickHouse's eval_results")
    er.add_argument("suite", nargs="+", help="a suite YAML file, or a shipped suite: safety, memory, formatting")
    er.add_argument("--label", default="", help="what this run is (a model, a policy, a build); default: the time")
    er.add_argument("--url", default="", help="the edge (default: the local stack's)")
    er.add_argument("--token", default="", help="a credential (default: one minted for the local stack)")
    er.add_argument("--tier", default="pro", choices=("free", "pro", "enterprise"))
    er.add_argument("--model", default=None, help="ask every turn of this model id")
    er.add_argument(
        "--policy",
        default="",
        help="a candidate safety policy: the suite runs through a pipeline of its own under it (production's "
        "policy is not changed)",
    )
    er.add_argument("--json", action="store_true")
    er.add_argument("--quiet", action="store_true", help="no progress bar")
    ec = ev.add_parser("compare", help="what flipped between two labels, from ClickHouse")
    ec.add_argument("a")
    ec.add_argument("b")
    ec.add_argument("--json", action="store_true")
    _reads_the_stack(er, cmd_eval_run)
    _reads_the_stack(ec, cmd_eval_compare)
    exp = sub.add_parser("export", help="datasets from production").add_subparsers(dest="export_command", required=True)
    fb = exp.add_parser(
        "feedback",
        help="JSON lines: each rated answer with the context the model saw, and up/down answers to one question "
        "as preference pairs",
    )
    fb.add_argument("--since", default="7d", help="ratings given since: ISO 8601, 90m/24h/7d ago, or epoch ms")
    fb.add_argument("--until", default="now")
    fb.add_argument("--pairs-only", action="store_true", help="only the preference pairs")
    _reads_the_stack(fb, cmd_export_feedback)
    usage = sub.add_parser("usage", help="metered usage").add_subparsers(dest="usage_command", required=True)
    rec = usage.add_parser(
        "reconcile",
        help="rebuild usage for a time range from the Kafka topics and report drift against ClickHouse "
        "(exit 2 when there is any)",
    )
    rec.add_argument("--since", default="24h", help="ISO 8601 (UTC unless it says), 90m/24h/7d ago, or epoch ms")
    rec.add_argument("--until", default="now")
    rec.add_argument("--namespace", default="", help="topic/table prefix (tests use their own)")
    rec.add_argument("--bootstrap", default="", help="Kafka (default: PARLEY_KAFKA_BOOTSTRAP or 127.0.0.1:9092)")
    rec.add_argument(
        "--metering-url", default="", help="the metering stage (default: PARLEY_METERING_URL, else the local stack's)"
    )
    rec.add_argument("--port-base", type=int, default=8000, help="the local stack's port base")
    rec.add_argument(
        "--registry-url",
        default="",
        help="the schema registry (default: PARLEY_SCHEMA_REGISTRY_URL, else the local stack's)",
    )
    rec.add_argument("--price-table", default="", help="the TOML price table the metering stage uses")
    rec.add_argument("--repair", action="store_true", help="write the rows missing from ClickHouse")
    rec.add_argument("--quiet", action="store_true", help="no progress bar")
    rec.set_defaults(fn=cmd_reconcile)
    args = parser.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
