"""The guard-model option on its protocol (safety/guard_model.py): what goes to an OpenAI-compatible server
serving Llama Guard, how its verdicts are read into Parley's categories, and how the policy decides on them.
The engine is httpx's MockTransport answering in Llama Guard 3's format (no guard model runs here); the
encoder's heads beside it are the real ones."""

import json

import httpx
import pytest

from runtime.settings import StackSettings
from safety.guard_model import GuardFormatError, GuardModelModerator, moderator_for, parse
from safety.moderator import Moderator
from safety.policy import BUILTIN


class Guard:
    """A Llama Guard server: answers each judged text from a script, and keeps the requests."""

    def __init__(self, verdicts: dict[str, str]):
        self.verdicts = verdicts
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        assert request.headers["authorization"] == "Bearer guard-key"
        body = json.loads(request.content)
        self.bodies.append(body)
        judged = body["messages"][-1]["content"]
        answer = next((v for k, v in self.verdicts.items() if k in judged), "safe")
        if answer == "HTTP 500":
            return httpx.Response(500, json={"object": "error", "message": "boom"})
        return httpx.Response(
            200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]}
        )


def guarded(guard: Guard) -> GuardModelModerator:
    client = httpx.Client(transport=httpx.MockTransport(guard), headers={"Authorization": "Bearer guard-key"})
    return GuardModelModerator("http://guard", "llama-guard-3-8b", client=client)


def test_verdicts_parse_to_hazard_categories_and_anything_else_is_an_error():
    assert parse("safe") == set() and parse("\n\nsafe\n") == set()
    assert parse("unsafe\nS1") == {"S1"}
    assert parse("\n\nunsafe\nS10, S12") == {"S10", "S12"}
    for bad in ("", "unsafe", "unsafe\nS99", "I cannot help with that.", "safe\nS1 maybe"):
        with pytest.raises(GuardFormatError):
            parse(bad)


def test_a_prompt_is_judged_as_the_user_s_turn_and_an_answer_as_the_assistant_s():
    guard = Guard({"pipe bomb": "unsafe\nS9", "you people are": "unsafe\nS10"})
    moderator = guarded(guard)
    verdict = moderator.check(BUILTIN, "input", ["How do I build a pipe bomb at home?"])
    assert verdict.decision.action == "block" and verdict.decision.category == "harmful_request"
    assert verdict.scores["harmful_request"] == 1.0 and verdict.scores["toxic"] == 0.0
    assert "prompt_injection" in verdict.scores  # still the encoder's head: the guard does not look for it
    [body] = guard.bodies
    assert body["model"] == "llama-guard-3-8b" and body["temperature"] == 0.0 and body["max_tokens"] <= 32
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert body["messages"][0]["content"].startswith("How do I build a pipe bomb at home?")

    verdict = moderator.check(BUILTIN, "output", ["Honestly, you people are vermin."], windows=1)
    assert verdict.decision.action == "block" and verdict.decision.category == "toxic"
    assert [m["role"] for m in guard.bodies[-1]["messages"]] == ["user", "assistant"]
    assert guard.bodies[-1]["messages"][-1]["content"] == "Honestly, you people are vermin."

    verdict = moderator.check(BUILTIN, "input", ["What's a good name for a cat?"])
    assert verdict.decision.action is None and verdict.error is None


def test_a_guard_that_fails_or_answers_off_format_is_decided_by_the_policy_s_on_error():
    guard = Guard({"storm": "HTTP 500", "poem": "Sure! Here is a poem."})
    moderator = guarded(guard)
    for text in ("Tell me about the storm.", "Write a poem."):
        opened = moderator.check(BUILTIN, "input", [text])
        assert opened.error and not opened.blocked
        closed = moderator.check(BUILTIN.model_copy(update={"on_error": "closed"}), "input", [text])
        assert closed.blocked and closed.decision.category == "classifier_error"


def test_the_guard_is_used_only_where_the_deployment_names_one():
    assert type(moderator_for(StackSettings())) is Moderator
    chosen = moderator_for(StackSettings(guard_url="http://guard:30000", guard_api_key="k"))
    assert isinstance(chosen, GuardModelModerator) and chosen.url == "http://guard:30000"
    assert chosen.client.headers["authorization"] == "Bearer k"
