"""The inference consumer's metrics, one set per process, labelled by pool: served at /metrics."""

from prometheus_client import Counter, Gauge, Histogram

TTFT = Histogram(
    "parley_inference_ttft_seconds",
    "Engine time to first token",
    ["pool"],
    buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
INTER_TOKEN = Histogram(
    "parley_inference_inter_token_seconds",
    "Time between delta records",
    ["pool"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1),
)
TOKENS = Counter("parley_inference_tokens_total", "Tokens generated", ["pool", "kind"])
RUNS = Counter("parley_inference_runs_total", "Runs finished", ["pool", "finish_reason"])
IN_FLIGHT = Gauge("parley_inference_in_flight", "Runs in the engine's batch", ["pool"])
QUEUED = Gauge("parley_inference_queued", "Runs read and waiting for a slot", ["pool"])
QUEUE_WAIT = Histogram(
    "parley_inference_queue_wait_seconds",
    "Time a run waited for a slot on this consumer, by tier",
    ["pool", "tier"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
CANCEL_LATENCY = Histogram(
    "parley_inference_cancel_seconds",
    "Cancel requested (edge clock) to the engine's sequence closed",
    ["pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2),
)
PREEMPTED = Counter(
    "parley_inference_preempted_total",
    "Background runs (summaries) stopped to give the engine to a reply",
    ["pool"],
)
HEALTHY = Gauge(
    "parley_inference_engine_healthy", "1 while the engine answers its health check", ["pool"]
)
TAKING_WORK = Gauge(
    "parley_inference_taking_work", "1 while this consumer is in its pool's group", ["pool"]
)
HANDED_OFF = Counter(
    "parley_inference_handed_off_total",
    "Runs stopped here to continue on another consumer",
    ["pool"],
)
DUPLICATES = Counter(
    "parley_inference_duplicates_dropped_total",
    "Runs scheduled again while this consumer still held them",
    ["pool"],
)
TAKEN_OVER = Counter(
    "parley_inference_taken_over_total",
    "Runs picked up after another consumer had started them",
    ["pool", "state"],
)
TOOL_CALLS = Counter(
    "parley_inference_tool_calls_total",
    "Calls runs made to registered MCP servers' tools, by server and how they ended",
    ["server", "status"],
)
