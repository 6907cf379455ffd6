"""Topic replay, the design card's third user: inspect any run, re-drive history under a candidate
configuration, and run eval suites through the real pipeline (docs/decisions/0014-topic-replay-and-evals.md)."""

# How a recorded run may have ended, as `parley replay --outcome` selects them.
OUTCOMES = ("allowed", "warned", "blocked", "completed", "rejected", "retracted", "cancelled")
