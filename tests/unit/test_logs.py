"""JSON logs carry the trace, span and run ids of the span they were written under; OTLP export follows OTEL_*."""

import io
import json
import logging

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from runtime import logs, tracing


def test_json_log_lines_carry_trace_span_and_run_ids():
    out = io.StringIO()
    handler = logs.handler("json")
    handler.setStream(out)
    logger = logging.getLogger("parley.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    tracer = TracerProvider().get_tracer("test")
    try:
        logger.warning("outside")
        with tracer.start_as_current_span("run") as span:
            span.set_attribute("parley.run_id", "r-42")
            logger.warning("inside %s", "a span")
            ctx = span.get_span_context()
    finally:
        logger.removeHandler(handler)
    outside, inside = (json.loads(line) for line in out.getvalue().splitlines())
    assert outside["message"] == "outside" and outside["trace_id"] == "" and outside["level"] == "WARNING"
    assert inside["message"] == "inside a span" and inside["logger"] == "parley.test.json"
    assert inside["trace_id"] == format(ctx.trace_id, "032x")
    assert inside["span_id"] == format(ctx.span_id, "016x")
    assert inside["run_id"] == "r-42"


def test_text_logs_stay_one_plain_line():
    out = io.StringIO()
    handler = logs.handler("text")
    handler.setStream(out)
    handler.handle(logging.LogRecord("parley", logging.INFO, __file__, 1, "hello %s", ("you",), None))
    assert out.getvalue().rstrip().endswith("INFO parley: hello you")


def test_spans_are_exported_only_when_otel_variables_ask():
    assert not tracing.exporting({})
    assert tracing.exporting({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.exporting({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing.exporting({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"})
    assert tracing.exporting({"OTEL_TRACES_EXPORTER": "otlp"})


def test_a_batch_puts_one_span_in_each_records_trace():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("test")
    carriers = []
    for _ in range(3):
        with tracer.start_as_current_span("producer"):
            carriers.append(tracing.inject())
    with tracing.consumed_batch(tracer, "metering batch", carriers):
        pass
    batch = [s for s in exported.get_finished_spans() if s.name == "metering batch"]
    producers = [s for s in exported.get_finished_spans() if s.name == "producer"]
    assert sorted(s.context.trace_id for s in batch) == sorted(s.context.trace_id for s in producers)
    assert {s.parent.span_id for s in batch} == {s.context.span_id for s in producers}
    assert trace.get_current_span() is trace.INVALID_SPAN
