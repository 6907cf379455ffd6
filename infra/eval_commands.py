"""`parley`'s eval and export commands: run shipped suites through the real pipeline and compare labels from
ClickHouse, and export rated answers as data. Registered on the CLI by infra/cli.py."""

from __future__ import annotations

import argparse
import sys

from infra.log_commands import connected, launch, moment, reads_the_stack
from infra.stack import Stack
from topics.clock import now_ms


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
    url, namespace, stack = (
        args.url or Stack(port_base=args.port_base).api_url,
        settings.namespace,
        None,
    )
    since = now_ms()
    results = []
    try:
        if policy is not None:
            # Under a candidate policy the suite runs through a pipeline of its own (edge included), in a
            # namespace of its own: production's policy is never changed for an eval.
            candidate = cand.Candidate(through="pipeline", policy=policy)
            namespace = f"{settings.namespace or 'parley'}-eval-{uuid.uuid4().hex[:8]}"
            cand.prepare(settings, namespace, candidate, {}, set())
            stack = launch(
                cand.processes(settings, namespace, candidate, free_port_base(), serving=True)
            )
            stack.start()
            stack.wait_ready()
            url = stack.api_url
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300
        ) as client:
            for suite in suites:
                results += evals.run_suite(
                    suite, label, client, progress=not args.quiet, model=args.model
                )
        with Window(settings.kafka_bootstrap, namespace) as window:
            evals.add_verdicts(window, results, since)
    finally:
        if stack is not None:
            stack.stop()
            cand.drop(settings, namespace, keyspace=True)
    written = evals.Store(metering, settings.internal_headers()).write(results)
    if args.json:
        print(
            json.dumps(
                {"label": label, "stored": written, "results": [r.row() for r in results]}, indent=2
            )
        )
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
        print(
            f"  {f['suite']}/{f['case']}: {'pass' if f[args.a] else 'fail'} -> {'pass' if f[args.b] else 'fail'}"
        )
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
        for line in export.lines(
            window, moment(args.since, now), moment(args.until, now), args.pairs_only
        ):
            counts[line["type"]] += 1
            print(json.dumps(line, ensure_ascii=False))
    print(f"{counts['rated']} rated answers, {counts['pair']} preference pairs", file=sys.stderr)
    if not any(counts.values()):
        raise SystemExit("parley export: no rated answer in the range")


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """eval run|compare, export feedback."""
    ev = sub.add_parser("eval", help="eval suites through the real pipeline").add_subparsers(
        dest="eval_command", required=True
    )
    er = ev.add_parser(
        "run", help="run suites through the edge; one row per case in ClickHouse's eval_results"
    )
    er.add_argument(
        "suite", nargs="+", help="a suite YAML file, or a shipped suite: safety, memory, formatting"
    )
    er.add_argument(
        "--label",
        default="",
        help="what this run is (a model, a policy, a build); default: the time",
    )
    er.add_argument("--url", default="", help="the edge (default: the local stack's)")
    er.add_argument(
        "--token", default="", help="a credential (default: one minted for the local stack)"
    )
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
    reads_the_stack(er, cmd_eval_run)
    reads_the_stack(ec, cmd_eval_compare)
    exp = sub.add_parser("export", help="datasets from production").add_subparsers(
        dest="export_command", required=True
    )
    fb = exp.add_parser(
        "feedback",
        help="JSON lines: each rated answer with the context the model saw, and up/down answers to one question "
        "as preference pairs",
    )
    fb.add_argument(
        "--since", default="7d", help="ratings given since: ISO 8601, 90m/24h/7d ago, or epoch ms"
    )
    fb.add_argument("--until", default="now")
    fb.add_argument("--pairs-only", action="store_true", help="only the preference pairs")
    reads_the_stack(fb, cmd_export_feedback)
