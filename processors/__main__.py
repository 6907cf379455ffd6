"""Run one stage: `python -m processors moderation|scheduling|persistence|metering|memory`."""

from __future__ import annotations

import sys

from processors.settings import ProcessorSettings
from processors.stage import Stage
from registry import client as registry
from runtime import logs

STAGES = ("moderation", "scheduling", "persistence", "metering", "memory")


def build(name: str, settings: ProcessorSettings) -> Stage:
    stage = Stage(name, settings)
    if name == "moderation":
        from processors import moderate_prompt
        from safety.moderator import Moderator
        from safety.policy import PolicyView

        policies = PolicyView(settings.kafka_bootstrap, settings.namespace, name)
        policies.start()
        moderate_prompt.register(stage, Moderator(), policies)
    elif name == "scheduling":
        from admission.limits import LimitsView
        from admission.placement import PoolView
        from conversation.gather import ContextGuard
        from processors import schedule_run
        from safety.moderator import Moderator
        from safety.policy import PolicyView
        from storage import schema
        from storage.conversations import Conversations
        from storage.ledger import Ledger
        from storage.memory import Memory

        session = schema.connect(settings.cassandra)
        conversations = Conversations(session, settings.keyspace_name, name)
        ledger = Ledger(session, settings.keyspace_name, name, settings.run_deadline_s)
        limits = LimitsView(settings.kafka_bootstrap, settings.namespace, name)
        pools = PoolView(settings.kafka_bootstrap, settings.namespace, name)
        policies = PolicyView(settings.kafka_bootstrap, settings.namespace, name)
        limits.start()
        pools.start()
        policies.start()
        context = ContextGuard(Moderator(), policies)
        memory = Memory(session, settings.keyspace_name, name)
        schedule_run.register(stage, conversations, ledger, limits, pools, context, memory)
    elif name == "persistence":
        from processors import persist_turn
        from storage import schema
        from storage.conversations import Conversations
        from storage.decisions import SafetyDecisions

        session = schema.connect(settings.cassandra)
        keyspace = settings.keyspace_name
        persist_turn.register(stage, Conversations(session, keyspace, name), SafetyDecisions(session, keyspace, name))
    elif name == "metering":
        from processors import meter_usage
        from storage.usage import open_usage

        meter_usage.register(stage, open_usage(settings))
    elif name == "memory":
        from processors import remember
        from safety.encoder import Encoder
        from storage import schema
        from storage.conversations import Conversations
        from storage.memory import Memory

        session = schema.connect(settings.cassandra)
        conversations = Conversations(session, settings.keyspace_name, name)
        remember.register(stage, conversations, Memory(session, settings.keyspace_name, name), Encoder(), settings)
    else:
        raise SystemExit(f"unknown stage {name!r}; one of {', '.join(STAGES)}")
    return stage


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in STAGES:
        raise SystemExit(f"usage: python -m processors {{{'|'.join(STAGES)}}}")
    settings = ProcessorSettings()
    logs.configure(settings.log_level, settings.log_format)
    name = sys.argv[1]
    registry.connect(settings.schema_registry_url)
    stage = build(name, settings)
    sys.argv = [sys.argv[0], "worker"]  # faust's Worker reads argv
    stage.run()


if __name__ == "__main__":
    main()
