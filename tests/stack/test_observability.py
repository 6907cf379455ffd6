"""Every stage exports Prometheus metrics, and one W3C trace follows a run across the stages."""

import httpx

from topics import tracing
from topics.pipeline import PROMPT_ACCEPTED, PROMPT_MODERATED, RUN_COMPLETED, RUN_SCHEDULED

from .conftest import chat_turn, for_run, read_topic, wait_for


def test_metrics_on_every_stage(live):
    client = live.client(live.token())
    chat = client.post("/v1/chats").json()
    chat_turn(client, chat["id"], "Hi!", max_tokens=4)
    assert "parley_edge_ttft_seconds" in httpx.get(f"{live.url}/metrics").text
    for stage in ("moderation", "scheduling", "persistence", "metering"):
        counted = f'parley_stage_events_total{{outcome="ok",stage="{stage}"'
        # the turn's events reach the sinks just after its stream ends (metering writes in 0.5 s batches)
        assert wait_for(lambda s=stage, c=counted: c in httpx.get(f"{live.stage_url(s)}/metrics").text, 10), stage
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
