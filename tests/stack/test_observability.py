"""Every stage exports Prometheus metrics, one W3C trace follows a run across the stages and reaches a real
collector, and every process answers its liveness and readiness probes."""

import uuid

import httpx

from infra import traces
from infra.cli import main
from runtime import tracing
from topics.pipeline import PROMPT_ACCEPTED, PROMPT_MODERATED, RUN_COMPLETED, RUN_SCHEDULED

from .conftest import chat_turn, for_run, read_topic, wait_for


def test_metrics_on_every_stage(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    chat_turn(client, chat["id"], "Hi!", max_tokens=4)
    assert "parley_edge_ttft_seconds" in httpx.get(f"{live.url}/metrics").text
    for stage in ("moderation", "scheduling", "persistence", "metering"):
        counted = f'parley_stage_events_total{{outcome="ok",stage="{stage}"'
        # The chat's partition is held by one of the stage's replicas; each replica exports its own counts.
        pages = [f"http://127.0.0.1:{s.port}/metrics" for s in live.stack.services() if s.name.split("-")[0] == stage]

        def counted_by_one(pages=pages, counted=counted) -> bool:
            return any(counted in httpx.get(page).text for page in pages)

        # the turn's events reach the sinks just after its stream ends (metering writes in 0.5 s batches)
        assert wait_for(counted_by_one, 10), stage
    text = httpx.get(f"{live.stage_url('inference')}/metrics").text
    assert "parley_inference_ttft_seconds_count" in text and "parley_inference_engine_healthy" in text


def test_trace_context_travels_in_kafka_headers(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    events = chat_turn(client, chat["id"], "Hello", max_tokens=4)
    run_id = events[0]["data"]["run_id"]
    trace_ids = set()
    for topic in (PROMPT_ACCEPTED, PROMPT_MODERATED, RUN_SCHEDULED["small"], RUN_COMPLETED):
        found = read_topic(live.topic(topic), for_run(topic.schema, run_id))
        assert len(found) == 1, topic.name
        headers = found[0].headers() or []
        assert any(k == "traceparent" for k, _ in headers), topic.name
        trace_ids.add(tracing.trace_id(headers))
    assert len(trace_ids) == 1 and "-" not in trace_ids


def spans_of(path, trace_id: str) -> list[dict]:
    """Every span of one trace the collector wrote (OTLP JSON, one export batch a line), with its service."""
    return [s for s in traces.spans(path) if s["traceId"] == trace_id]


def test_one_trace_of_a_run_reaches_the_collector_with_a_span_from_every_stage(live, capsys):
    """The caller's traceparent is continued by the edge, and every process the run passes through exports its
    span over OTLP to the stack's real OpenTelemetry Collector, which writes them to its file."""
    caller_trace, caller_span = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    client = live.client(live.token())
    client.headers["traceparent"] = f"00-{caller_trace}-{caller_span}-01"
    chat = client.post("/v1/chats").json()
    run_id = chat_turn(client, chat["id"], "Hello there", max_tokens=4)[0]["data"]["run_id"]
    services = {"parley-api", "parley-moderation", "parley-scheduling", "parley-persistence", "parley-metering"}
    services |= {"parley-memory", "parley-inference-small"}

    def orphans(spans: list[dict]) -> list[str]:
        ids = {s["spanId"] for s in spans}
        return [s["name"] for s in spans if s.get("parentSpanId") not in ids | {caller_span}]

    def complete() -> bool:
        # Each process sends its spans when they end, in batches about a second apart: a child (a stage's span)
        # can reach the file before its parent (the edge's request span, which ends with the stream).
        spans = spans_of(live.stack.spans_file, caller_trace)
        return services <= {s["service"] for s in spans} and not orphans(spans)

    wait_for(complete, 60)
    spans = spans_of(live.stack.spans_file, caller_trace)
    assert services <= {s["service"] for s in spans}, sorted({s["service"] for s in spans})
    edge = [s for s in spans if s["service"] == "parley-api" and s.get("parentSpanId") == caller_span]
    assert {s["name"] for s in edge} >= {"POST /v1/chats/{chat_id}/messages"}, [s["name"] for s in edge]
    assert orphans(spans) == []  # one tree: every span's parent is in the trace, the root's is the caller's

    # `parley trace RUN_ID` prints that tree for an operator, a line a span, each service in it.
    main(["trace", run_id, "--namespace", live.namespace, "--port-base", str(live.stack.port_base)])
    printed = capsys.readouterr().out
    assert printed.count("\n") >= len(spans) and all(f"{name}: " in printed for name in services), printed


def test_every_process_answers_liveness_and_readiness(live):
    stack = live.stack
    for service in stack.services():
        if service.name == "otelcol":
            continue
        base = f"http://127.0.0.1:{service.port}"
        assert httpx.get(f"{base}/livez", timeout=5).status_code == 200, service.name
        ready = httpx.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["status"] == "ok", (service.name, ready.text)
