"""The typed events (topics/events.py) are what topics/events_gen.py writes from schemas/, and every topic's
declared event type is its schema's; every field of every event is read-only."""

import typing_extensions

from topics import codec, events, events_gen
from topics.pipeline import TOPICS


def test_the_event_types_are_generated_from_the_schemas_as_they_stand():
    assert events.__file__ and events_gen.render() == events_gen.TARGET.read_text(), (
        "schemas/ changed: run `python -m topics.events_gen`"
    )


def test_each_type_has_its_schemas_fields_and_a_field_with_a_default_may_be_left_out():
    for name, raw in codec._raw(codec.SCHEMA_DIR).items():
        typed = getattr(events, name)
        assert typed.__required_keys__ | typed.__optional_keys__ == {f["name"] for f in raw["fields"]}, name
        assert typed.__optional_keys__ == {f["name"] for f in raw["fields"] if "default" in f}, name
        assert typed.__readonly_keys__ == typed.__required_keys__ | typed.__optional_keys__, name  # frozen


def test_a_limits_row_carries_exactly_the_limits_the_edge_sets():
    from admission.limits import FIELDS, change

    row = change("user", "u1", {"max_concurrent": 3}, "admin")
    assert set(row) == events.LimitsChanged.__required_keys__ | events.LimitsChanged.__optional_keys__
    assert set(FIELDS) <= events.LimitsChanged.__optional_keys__ and row["max_concurrent"] == 3


def test_every_topic_declares_the_event_type_of_its_schema():
    for topic in TOPICS:
        assert topic.event is getattr(events, topic.schema), topic.name
        assert typing_extensions.get_type_hints(events.RunScheduled)["prompt"] is events.PromptAccepted
