"""W3C trace context in Kafka headers, so one trace follows a run across every stage."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

Headers = list[tuple[str, str | bytes | None]]
# What Kafka clients hand back: a list of pairs (confluent-kafka, aiokafka) or a mapping (faust).
AnyHeaders = (
    Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | dict[str, str | bytes | None] | None
)

_propagator = TraceContextTextMapPropagator()


def setup(service: str) -> trace.Tracer:
    """Install a tracer provider once per process; spans get real ids that travel in headers."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        from opentelemetry.sdk.resources import Resource

        trace.set_tracer_provider(TracerProvider(resource=Resource.create({"service.name": service})))
    propagate.set_global_textmap(_propagator)
    return trace.get_tracer(service)


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
