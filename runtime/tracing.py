"""W3C trace context in Kafka headers, so one trace follows a run across every stage, and spans exported over
OTLP when the standard OTEL_* variables ask for it (docs/operations.md)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

Headers = list[tuple[str, str | bytes | None]]
# What Kafka clients hand back: a list of pairs (confluent-kafka, aiokafka) or a mapping (faust).
AnyHeaders = (
    Sequence[tuple[str, bytes | str | None]]
    | Mapping[str, bytes | str | None]
    | dict[str, str | bytes | None]
    | None
)

_propagator = TraceContextTextMapPropagator()
log = logging.getLogger("parley.tracing")


def exporting(env: Mapping[str, str] = os.environ) -> bool:
    """Spans leave the process when OTEL_TRACES_EXPORTER is otlp, or is unset and an OTLP endpoint is named
    (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); `none` turns export off."""
    chosen = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if chosen:
        return chosen == "otlp"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def setup(service: str) -> trace.Tracer:
    """Install a tracer provider once per process; spans get real ids that travel in headers, and are sent in
    batches to the OTLP endpoint (HTTP/protobuf) the OTEL_EXPORTER_OTLP_* variables name. OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES add to the resource; the service name is the process's role unless set."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        from opentelemetry.sdk.resources import Resource

        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
        provider = TracerProvider(resource=Resource.create(attributes))
        if exporting():
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            # Endpoint, headers, timeout and compression from OTEL_EXPORTER_OTLP_*.
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            where = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
                "OTEL_EXPORTER_OTLP_ENDPOINT"
            )
            log.info("%s: exporting spans over OTLP to %s", service, where)
        trace.set_tracer_provider(provider)
    propagate.set_global_textmap(_propagator)
    return trace.get_tracer(service)


def flush(timeout_ms: int = 5000) -> None:
    """Send the spans still batched (a stage that stops would otherwise lose its last ones)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush(timeout_ms)


def current_ids() -> tuple[str, str, str]:
    """The current span's trace id, span id and run id (the parley.run_id attribute), '' where there is none."""
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return "", "", ""
    attributes = getattr(span, "attributes", None) or {}
    return (
        format(ctx.trace_id, "032x"),
        format(ctx.span_id, "016x"),
        str(attributes.get("parley.run_id", "")),
    )


def inject(headers: Headers | None = None) -> Headers:
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    out = list(headers or [])
    out.extend((k, v.encode()) for k, v in carrier.items())
    return out


def extract(headers: AnyHeaders) -> context.Context:
    carrier = {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for key, value in pairs:
        if value is None:
            continue
        carrier[key] = value.decode() if isinstance(value, bytes) else value
    return _propagator.extract(carrier)


def trace_id(headers: AnyHeaders) -> str:
    span = trace.get_current_span(extract(headers))
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else "-"


@contextmanager
def consumed_span(tracer: trace.Tracer, name: str, headers: AnyHeaders) -> Iterator[trace.Span]:
    """A span that continues the trace carried by a consumed record's headers."""
    token = context.attach(extract(headers))
    try:
        with tracer.start_as_current_span(name, kind=trace.SpanKind.CONSUMER) as span:
            yield span
    finally:
        context.detach(token)


@contextmanager
def consumed_batch(tracer: trace.Tracer, name: str, batch: Sequence[AnyHeaders]) -> Iterator[None]:
    """One span in each consumed record's own trace, all covering the batch's single write: a run's trace shows
    the stage that stored it in a batch with other runs (a batch span linked to many traces would sit in none)."""
    spans = [
        tracer.start_span(name, context=extract(headers), kind=trace.SpanKind.CONSUMER)
        for headers in batch
    ]
    for span in spans:
        span.set_attribute("messaging.batch.message_count", len(spans))
    try:
        yield
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(trace.StatusCode.ERROR)
        raise
    finally:
        for span in spans:
            span.end()
