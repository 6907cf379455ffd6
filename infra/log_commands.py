"""`parley`'s commands that read a stack's log and stores: inspect a run, replay recorded runs under a candidate,
run and compare evals, export rated answers, reconcile metered usage. Registered on the CLI by infra/cli.py."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from infra.stack import Stack
from replay import OUTCOMES
from runtime.settings import StackSettings
from topics.clock import now_ms

if TYPE_CHECKING:
    from replay.candidate import Candidate, Processes


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


def launch(spec: Processes) -> Stack:
    """A candidate's processes (replay/candidate.py) as a local stack of their own."""
    return Stack(
        namespace=spec.namespace,
        port_base=spec.port_base,
        only=spec.only,
        registry=spec.registry,
        overrides=spec.overrides,
    )


def connected(args: argparse.Namespace) -> tuple[StackSettings, str]:
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


def cmd_reconcile(args: argparse.Namespace) -> None:
    import json
    import os

    from processors.meter_usage import Prices
    from processors.reconcile import reconcile

    now = now_ms()
    since, until = moment(args.since, now), moment(args.until, now)
    settings, metering = connected(args)
    prices = Prices.load(args.price_table or os.environ.get("PARLEY_PRICE_TABLE", ""))
    drift = reconcile(
        settings.kafka_bootstrap, args.namespace, metering, since, until, prices, args.repair, not args.quiet
    )
    print(json.dumps(drift.summary(), indent=2, default=str))
    if not drift.zero:
        raise SystemExit(2)


def cmd_runs_show(args: argparse.Namespace) -> None:
    import json

    from runtime.window import Window
    from storage import history

    settings, metering = connected(args)
    try:
        history.minted_ms(args.run_id)
        with Window(settings.kafka_bootstrap, settings.namespace) as window:
            run = history.find(window, args.run_id)
    except (ValueError, LookupError) as exc:
        raise SystemExit(f"parley runs show: {exc}") from None
    if not args.no_stored:
        run.stored = history.stored(run, settings, metering)
    print(json.dumps(run.as_json(), indent=2, default=str) if args.json else history.text(run))


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
    import signal

    from replay import candidate as cand
    from replay import redrive, report, selection
    from runtime.window import Window

    settings, _ = connected(args)
    now = now_ms()
    plan = None
    # A KeyboardInterrupt raised inside a weakref callback is printed and dropped, and the replay ran on to
    # exit 0 (seen in CI): the flag keeps a Ctrl-C, and the replay asks for it between its steps.
    interrupted = False

    def interrupt(*_: object) -> None:
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    try:
        if args.resume:
            plan = redrive.Plan.load(args.resume)
            with Window(settings.kafka_bootstrap, plan.production) as window:
                runs = redrive.recorded_again(window, plan)
        else:
            candidate = candidate_of(args)
            chosen = selection.Selection(
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
                runs = selection.select(window, chosen)
            if not runs:
                raise redrive.ReplayError("no recorded run matches the selection (check the range and filters)")
            plan = redrive.new_plan(settings, candidate, chosen, runs)
            print(f"replay {plan.id}: {len(runs)} runs (resume with --resume {plan.id})", file=sys.stderr)
        replay = redrive.Replay(plan, settings, launch, progress=not args.quiet, stopped=lambda: interrupted)
        found = replay.run(runs, keep=args.keep)
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
    from runtime.window import Window

    settings, metering = connected(args)
    try:
        suites = [evals.load(path) for path in args.suite]
        policy = cand.load_policy(args.policy) if args.policy else None
    except (evals.SuiteError, cand.CandidateError) as exc:
        raise SystemExit(f"parley eval: {exc}") from None
    from api.auth import credential

    label = args.label or evals.new_label()
    token = args.token or credential(f"eval-{label}", args.tier, 24 * 3600)
    url, namespace, stack = args.url or Stack(port_base=args.port_base).api_url, settings.namespace, None
    since = now_ms()
    results = []
    try:
        if policy is not None:
            # Under a candidate policy the suite runs through a pipeline of its own (edge included), in a
            # namespace of its own: production's policy is never changed for an eval.
            candidate = cand.Candidate(through="pipeline", policy=policy)
            namespace = f"{settings.namespace or 'parley'}-eval-{uuid.uuid4().hex[:8]}"
            cand.prepare(settings, namespace, candidate, {}, set())
            stack = launch(cand.processes(settings, namespace, candidate, free_port_base(), serving=True))
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

    settings, metering = connected(args)
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
    from runtime.window import Window

    settings, _ = connected(args)
    now = now_ms()
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


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """runs show, replay, eval run|compare, export feedback, usage reconcile."""
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
