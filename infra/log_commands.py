"""`parley`'s commands that read a stack's log and stores: inspect a run, replay recorded runs under a candidate,
reconcile metered usage (evals and exports: infra/eval_commands.py). Registered on the CLI by infra/cli.py."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from infra.stack import Stack
from replay import OUTCOMES
from runtime import kafka_auth, keys
from runtime.settings import StackSettings, local_kek
from topics.clock import now_ms

FINDING = 3  # the exit status of a command that ran and found something wrong (infra/cli.py)

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
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601, 24h/7d ago, now, or epoch ms)"
        ) from exc
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


def stack_settings(args: argparse.Namespace) -> tuple[StackSettings, str]:
    """The settings and the metering stage's URL of the stack a command names. PARLEY_* where the command runs
    (a pod on a cluster) decide; the local single-node stack's values fill in only what they leave unset. A
    command's own --bootstrap, --registry-url or --metering-url, where it has them, come first."""
    stack = Stack(namespace=args.namespace, port_base=args.port_base)
    local = {
        k: v
        for k, v in stack.topology.settings(stack.state).items()
        if f"PARLEY_{k.upper()}" not in os.environ
    }
    url = (
        getattr(args, "registry_url", "")
        or os.environ.get("PARLEY_SCHEMA_REGISTRY_URL")
        or stack.registry_url
    )
    stage = next(
        s for s in stack.services() if s.name == "metering"
    )  # the local stack's metering stage
    metering = (
        getattr(args, "metering_url", "")
        or os.environ.get("PARLEY_METERING_URL")
        or f"http://127.0.0.1:{stage.port}"
    )
    update: dict[str, object] = {**local, "namespace": args.namespace, "schema_registry_url": url}
    if getattr(args, "bootstrap", ""):
        update["kafka_bootstrap"] = args.bootstrap
    if not (os.environ.get("PARLEY_KEK") or os.environ.get("PARLEY_KEK_FILE")):
        update["kek_file"] = str(local_kek(stack.state))  # the local stack's
    if not os.environ.get("PARLEY_USAGE_URL"):
        update["usage_url"] = stage.env["PARLEY_USAGE_URL"]  # the local stack's engine folder
    settings = StackSettings().model_copy(update=update)
    kafka_auth.secure(settings)  # this command's Kafka clients sign in as the stack's tools
    return settings, metering


def connected(args: argparse.Namespace, *, creates: bool = False) -> tuple[StackSettings, str]:
    """The settings, the schema registry connected, the person keys read (made too, with `creates`, as the
    edge makes them), and the metering stage's URL: what the commands that read the log and the stores need."""

    from registry import client as registry

    settings, metering = stack_settings(args)
    registry.connect(settings.schema_registry_url)
    keys.check(settings)
    keys.start(
        settings, "api", creates=creates
    )  # people's text read through their keys, as the edge does
    return settings, metering


def cmd_reconcile(args: argparse.Namespace) -> None:
    import json

    from processors.meter_usage import Prices
    from processors.reconcile import reconcile

    now = now_ms()
    since, until = moment(args.since, now), moment(args.until, now)
    settings, metering = connected(args)
    prices = Prices.load(args.price_table or os.environ.get("PARLEY_PRICE_TABLE", ""))
    drift = reconcile(
        settings.kafka_bootstrap,
        args.namespace,
        metering,
        since,
        until,
        prices,
        args.repair,
        not args.quiet,
    )
    print(json.dumps(drift.summary(), indent=2, default=str))
    if not drift.zero:
        raise SystemExit(FINDING)


def cmd_runs_show(args: argparse.Namespace) -> None:
    import json

    from infra import run_text
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
    print(json.dumps(run.as_json(), indent=2, default=str) if args.json else run_text.text(run))


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
    # A KeyboardInterrupt raised inside a weakref callback is printed and dropped, and the replay would run on
    # to exit 0: the flag keeps a Ctrl-C, and the replay asks for it between its steps.
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
                raise redrive.ReplayError(
                    "no recorded run matches the selection (check the range and filters)"
                )
            plan = redrive.new_plan(settings, candidate, chosen, runs)
            print(
                f"replay {plan.id}: {len(runs)} runs (resume with --resume {plan.id})",
                file=sys.stderr,
            )
        replay = redrive.Replay(
            plan, settings, launch, progress=not args.quiet, stopped=lambda: interrupted
        )
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
        raise SystemExit(
            f"{len(found['missing'])} runs got no result; resume with --resume {found['replay_id']}"
        )


def namespace_option(parser: argparse.ArgumentParser) -> None:
    """--namespace, by default the deployment's (PARLEY_NAMESPACE, which the chart sets in every pod)."""
    parser.add_argument(
        "--namespace",
        default=os.environ.get("PARLEY_NAMESPACE", ""),
        help="topic/keyspace prefix (default: $PARLEY_NAMESPACE; tests use their own)",
    )


def reads_the_stack(
    parser: argparse.ArgumentParser, fn: Callable[[argparse.Namespace], None]
) -> None:
    """The options of a command that reads a stack's log and stores: which namespace, which local stack."""
    namespace_option(parser)
    parser.add_argument("--port-base", type=int, default=8000, help="the local stack's port base")
    parser.set_defaults(fn=fn)


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """runs show, replay, usage reconcile."""
    runs = sub.add_parser("runs", help="recorded runs").add_subparsers(
        dest="runs_command", required=True
    )
    show = runs.add_parser(
        "show", help="one run's whole history across the topics, in order, and what was stored"
    )
    show.add_argument("run_id")
    show.add_argument(
        "--json",
        action="store_true",
        help='{"run_id", "trace_id", "events": [...], "stored": {...}}',
    )
    show.add_argument(
        "--no-stored", action="store_true", help="the log only: skip Cassandra and metering"
    )
    reads_the_stack(show, cmd_runs_show)
    rp = sub.add_parser(
        "replay",
        help="send recorded runs again through the real moderation stage under a candidate policy, in a "
        "namespace of their own, and report what changes",
    )
    rp.add_argument(
        "--policy",
        default="",
        help="a safety policy file (the body of PUT /v1/admin/safety/policies)",
    )
    rp.add_argument(
        "--limits",
        default="",
        help='a limits file: {"tiers": {tier: {...}}, "users": {user: {...}}}',
    )
    rp.add_argument(
        "--set",
        action="append",
        default=[],
        help="a stage setting, KEY=VALUE (recall_k=3, pools=...)",
    )
    rp.add_argument(
        "--system-prompt", default=None, help="the system prompt the scheduler puts first"
    )
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
    rp.add_argument(
        "--since", default="24h", help="ISO 8601 (UTC unless it says), 90m/24h/7d ago, or epoch ms"
    )
    rp.add_argument("--until", default="now")
    rp.add_argument(
        "--outcome", choices=OUTCOMES, default=None, help="only runs that ended this way"
    )
    rp.add_argument("--feedback", choices=("up", "down"), default=None, help="only runs rated so")
    rp.add_argument("--limit", type=int, default=0, help="at most this many runs (the earliest)")
    rp.add_argument("--resume", default="", help="carry on an interrupted replay by its id")
    rp.add_argument("--keep", action="store_true", help="keep the replay's topics afterwards")
    rp.add_argument(
        "--json", action="store_true", help='{"runs", "changed": [...], "summary": {...}, ...}'
    )
    rp.add_argument("--quiet", action="store_true", help="no progress bar")
    reads_the_stack(rp, cmd_replay)
    usage = sub.add_parser("usage", help="metered usage").add_subparsers(
        dest="usage_command", required=True
    )
    rec = usage.add_parser(
        "reconcile",
        help="rebuild usage for a time range from the Kafka topics and report drift against ClickHouse "
        "(exit 2 when there is any)",
    )
    rec.add_argument(
        "--since", default="24h", help="ISO 8601 (UTC unless it says), 90m/24h/7d ago, or epoch ms"
    )
    rec.add_argument("--until", default="now")
    namespace_option(rec)
    rec.add_argument(
        "--bootstrap", default="", help="Kafka (default: PARLEY_KAFKA_BOOTSTRAP or 127.0.0.1:9092)"
    )
    rec.add_argument(
        "--metering-url",
        default="",
        help="the metering stage (default: PARLEY_METERING_URL, else the local stack's)",
    )
    rec.add_argument("--port-base", type=int, default=8000, help="the local stack's port base")
    rec.add_argument(
        "--registry-url",
        default="",
        help="the schema registry (default: PARLEY_SCHEMA_REGISTRY_URL, else the local stack's)",
    )
    rec.add_argument(
        "--price-table", default="", help="the TOML price table the metering stage uses"
    )
    rec.add_argument("--repair", action="store_true", help="write the rows missing from ClickHouse")
    rec.add_argument("--quiet", action="store_true", help="no progress bar")
    rec.set_defaults(fn=cmd_reconcile)
