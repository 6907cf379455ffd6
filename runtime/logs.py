"""Logging for every process: plain text for a terminal, or one JSON object a line (PARLEY_LOG_FORMAT=json)
carrying the current trace, span and run ids, for a log pipeline to index and join with traces."""

from __future__ import annotations

import logging
import logging.config
from typing import Any

from pythonjsonlogger.json import JsonFormatter

from runtime import tracing

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s %(trace_id)s %(span_id)s %(run_id)s"


class TraceIds(logging.Filter):
    """Stamps each record with the span it was logged under (empty outside one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id, record.span_id, record.run_id = tracing.current_ids()
        return True


def handler(fmt: str = "text") -> logging.Handler:
    """A stderr handler in the chosen format (the factory logging.config builds the root handler with)."""
    out = logging.StreamHandler()
    out.addFilter(TraceIds())
    if fmt == "json":
        renamed = {"asctime": "time", "levelname": "level", "name": "logger"}
        out.setFormatter(JsonFormatter(JSON_FIELDS, rename_fields=renamed))
    else:
        out.setFormatter(logging.Formatter(TEXT))
    return out


def config(level: str, fmt: str = "text") -> dict[str, Any]:
    """The logging configuration, as a dict: faust's worker applies it in place of its own coloured one."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"default": {"()": "runtime.logs.handler", "fmt": fmt}},
        "root": {"level": level.upper(), "handlers": ["default"]},
        "loggers": {"httpx": {"level": "WARNING"}},
    }


def configure(level: str, fmt: str = "text") -> None:
    """The root logger: `text` (the default) or `json`."""
    logging.config.dictConfig(config(level, fmt))
