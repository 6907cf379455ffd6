"""`parley`: bring the local stack up or down, mint credentials for it, manage its topics, show a run's trace;
and the commands that read the log and the stores (infra/log_commands.py, infra/eval_commands.py): inspect a run,
replay recorded runs under a candidate, run evals, export rated answers, reconcile metered usage; back a stack up
and restore it (infra/backup_commands.py)."""

from __future__ import annotations

import argparse
import getpass
import importlib.metadata
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from infra import backup_commands, eval_commands, log_commands
from infra.stack import Stack
from infra.topology import CLUSTER, SINGLE_NODE

if TYPE_CHECKING:
    pass

EXIT_CODES = """exit status: 0 done; 1 failed (the message says why); 2 a usage error; 3 a finding (usage drift)."""


def workers(text: str) -> dict[str, int]:
    """'small=2,large=1' -> {'small': 2, 'large': 1}"""
    from topics.pipeline import POOLS

    found: dict[str, int] = {}
    for part in text.split(","):
        pool, _, count = part.partition("=")
        if pool not in POOLS or not count.isdigit():
            raise argparse.ArgumentTypeError(
                f"expected pool=count with a pool in {POOLS}, got {part!r}"
            )
        found[pool] = int(count)
    return found


def _stack(args: argparse.Namespace) -> Stack:
    """The stack the arguments name. A cluster runs two edge replicas and two consumers per pool unless told."""
    cluster = args.cluster
    workers = getattr(
        args, "workers", None
    )  # commands that start nothing (topics) do not take the sizes
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

    print(credential(args.user, args.tier, args.ttl, args.admin, role=args.role))


def sign_in_links(api_url: str) -> str:
    """A link that opens the chat app signed in as the local owner (its token, good for a day, becomes a browser
    session), and the usage dashboard, which that session opens too."""
    from api.auth import credential

    user = getpass.getuser() or "you"
    owner = credential(user, "pro", 86_400, role="owner")
    return (
        f"  chat (signed in as {user}, the owner): {api_url}/#token={owner}\n"
        f"  usage dashboard:  {api_url}/dashboard"
    )


def cmd_up(args: argparse.Namespace) -> None:
    stack = _stack(args)
    stack.up()
    print(
        f"Parley is up: {stack.api_url}  (timings: {stack.timings})\n{sign_in_links(stack.api_url)}",
        flush=True,
    )


def cmd_run(args: argparse.Namespace) -> None:
    stack = _stack(args)
    stopping = False

    def interrupt(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(
        signal.SIGPIPE, signal.SIG_IGN
    )  # `make run | tee` must not stop us before we clean up
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

    from runtime.kafka import ensure_topics, grow_topics
    from runtime.kafka_auth import secure

    stack = _stack(args)
    secure(stack.settings)
    settings = stack.settings.model_copy(
        update={
            k: v for k, v in (("chat_partitions", args.chat), ("reply_partitions", args.reply)) if v
        }
    )
    if args.topics_command == "grow":
        grown = grow_topics(settings.kafka_bootstrap, settings.namespace, settings.layout)
        print(json.dumps({"grown": grown}, indent=2))
        print(
            "restart the stages, consumers and edges one at a time to read the new partitions now",
            file=sys.stderr,
        )
    else:
        print(
            json.dumps(
                {
                    "created": ensure_topics(
                        settings.kafka_bootstrap, settings.namespace, settings.layout
                    )
                }
            )
        )


def cmd_trace(args: argparse.Namespace) -> None:
    from infra.traces import run_trace, tree

    stack = Stack(namespace=args.namespace, port_base=args.port_base)
    path = Path(args.file) if args.file else stack.spans_file
    lines = tree(run_trace(path, args.run_id))
    if not lines:
        raise SystemExit(
            f"no span of run {args.run_id} in {path} (spans arrive about a second after they end)"
        )
    print(f"trace of run {args.run_id} (from {path}):\n" + "\n".join(lines))


def version() -> str:
    """The installed package's version; in the image, which runs from its sources, pyproject.toml's."""
    try:
        return importlib.metadata.version("parley")
    except importlib.metadata.PackageNotFoundError:
        import tomllib

        from runtime.settings import REPO_ROOT

        project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
        return str(project["version"])


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    args.fn(args)


def build_parser() -> argparse.ArgumentParser:
    """Every command and its options (the defaults read from the environment now: PARLEY_NAMESPACE)."""
    parser = argparse.ArgumentParser(prog="parley", description=__doc__, epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"parley {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    token = sub.add_parser(
        "token", help="print a development token for the local stack (PARLEY_DEV_TOKENS)"
    )
    token.add_argument("--user", required=True)
    token.add_argument("--tier", choices=("free", "pro", "enterprise"), default="free")
    token.add_argument("--ttl", type=int, default=30 * 24 * 3600, help="seconds until it expires")
    token.add_argument(
        "--admin", action="store_true", help="the admin role: limits, people, others' runs"
    )
    token.add_argument(
        "--role", choices=("owner", "admin", "auditor", "member"), help="a role (over --admin)"
    )
    token.set_defaults(fn=cmd_token)
    for name, fn, text in (
        ("up", cmd_up, "start everything in the background"),
        ("run", cmd_run, "start everything; Ctrl-C stops it"),
        ("down", cmd_down, "stop everything"),
        ("status", cmd_status, "which processes run"),
    ):
        p = sub.add_parser(name, help=text)
        log_commands.namespace_option(p)
        p.add_argument("--port-base", type=int, default=8000)
        p.add_argument(
            "--cluster",
            action="store_true",
            help="3 Kafka brokers and 3 Cassandra nodes (127.0.0.11-13) keeping 3 copies; 2 edges, 2 consumers a pool",
        )
        p.add_argument(
            "--replicas",
            type=int,
            default=0,
            help="edge replicas (ports base, base+100, ...); default 1",
        )
        p.add_argument("--stages", type=int, default=1, help="replicas of each processor stage")
        p.add_argument(
            "--workers",
            type=workers,
            default=None,
            help="inference consumers per pool, e.g. small=2,large=1 (each with its own engine); default 1 each",
        )
        if name == "down":
            p.add_argument(
                "--keep-services", action="store_true", help="leave Kafka and Cassandra running"
            )
        if name == "status":
            p.add_argument(
                "--json",
                action="store_true",
                help="a JSON list: name, role, pid, address, broker_id",
            )
        p.set_defaults(fn=fn)
    topics = sub.add_parser("topics", help="the pipeline's Kafka topics").add_subparsers(
        dest="topics_command", required=True
    )
    for name, text in (
        (
            "create",
            "create every topic and dead-letter topic that is missing (partitions and copies from settings)",
        ),
        (
            "grow",
            "raise the partition counts of existing topics to --chat / --reply (or the settings')",
        ),
    ):
        p = topics.add_parser(name, help=text)
        log_commands.namespace_option(p)
        p.add_argument("--port-base", type=int, default=8000)
        p.add_argument("--cluster", action="store_true", help="the local cluster's brokers")
        p.add_argument("--chat", type=int, default=0, help="partitions of every chat-keyed topic")
        p.add_argument(
            "--reply", type=int, default=0, help="partitions of the reply topics (edge replicas)"
        )
        p.set_defaults(fn=cmd_topics)
    trace = sub.add_parser(
        "trace", help="one run's trace, as the local collector received it, as a tree"
    )
    trace.add_argument("run_id")
    log_commands.namespace_option(trace)
    trace.add_argument("--port-base", type=int, default=8000)
    trace.add_argument(
        "--file", default="", help="an OTLP JSON spans file (default: the local stack's)"
    )
    trace.set_defaults(fn=cmd_trace)
    log_commands.add_commands(sub)
    eval_commands.add_commands(sub)
    backup_commands.add_commands(sub)
    return parser


if __name__ == "__main__":
    main()
