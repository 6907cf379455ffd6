"""Schemathesis hooks for tests/stack/test_fuzz.py, loaded through SCHEMATHESIS_HOOKS."""

import schemathesis

MOST_TOKENS = 8  # a fuzzed run's answer: a 4,096-token one takes over a minute on this CPU, and says no more


@schemathesis.hook
def before_call(context, case, kwargs):
    """Any max_tokens the fuzzer picks above MOST_TOKENS is sent as MOST_TOKENS (still a valid value)."""
    body = case.body
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if type(value) is int and value > MOST_TOKENS:
            body[field] = MOST_TOKENS
