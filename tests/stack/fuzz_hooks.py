"""Schemathesis hooks for tests/stack/test_fuzz.py, loaded through SCHEMATHESIS_HOOKS."""

import schemathesis

MOST_TOKENS = 8  # a fuzzed run's answer: a 4,096-token one takes over a minute on this CPU, and says no more


# the routes that start a run, and the field that bounds its answer there
BOUNDED = {"/v1/chat/completions": "max_tokens", "/v1/responses": "max_output_tokens"}


@schemathesis.hook
def before_call(context, case, kwargs):
    """Any max_tokens the fuzzer picks above MOST_TOKENS is sent as MOST_TOKENS (still a valid value), and a run
    it starts without one gets MOST_TOKENS too: the default (256) takes over 10 s on this CPU under the fuzzer's
    load, past its response-time check (a Responses request without max_output_tokens did)."""
    body = case.body
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(field)
        if type(value) is int and value > MOST_TOKENS:
            body[field] = MOST_TOKENS
    field = BOUNDED.get(case.operation.path)
    if field and "max_completion_tokens" not in body and field not in body:
        body[field] = MOST_TOKENS
