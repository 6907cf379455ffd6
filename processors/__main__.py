"""Run one stage: `python -m processors moderation|scheduling|persistence|metering|memory`.

Which module a stage is comes from the pipeline's declaration (topics/pipeline.py PROCESSES); that module's
`build(stage, settings)` makes the stage's dependencies and serves its HANDLERS.
"""

from __future__ import annotations

import importlib
import sys

from processors.settings import ProcessorSettings
from processors.stage import Stage
from registry import client as registry
from runtime import keys, logs
from topics.pipeline import FAUST_STAGES, process


def build(name: str, settings: ProcessorSettings) -> Stage:
    if name not in FAUST_STAGES:
        raise SystemExit(f"unknown stage {name!r}; one of {', '.join(FAUST_STAGES)}")
    stage = Stage(name, settings)
    importlib.import_module(process(name).module).build(stage, settings)
    return stage


def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in FAUST_STAGES:
        raise SystemExit(f"usage: python -m processors {{{'|'.join(FAUST_STAGES)}}}")
    settings = ProcessorSettings()
    logs.configure(settings.log_level, settings.log_format)
    name = sys.argv[1]
    registry.connect(settings.schema_registry_url)
    keys.check(settings)
    keys.start(settings, name)
    stage = build(name, settings)
    sys.argv = [sys.argv[0], "worker"]  # faust's Worker reads argv
    stage.run()


if __name__ == "__main__":
    main()
