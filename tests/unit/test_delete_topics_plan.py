"""DeleteTopics v6 (KIP-516): topics named by name or ID, sorted out as Kafka's
ControllerApis.deleteTopics before the rest is forwarded (broker/kafka/delete_topics_plan)."""

from __future__ import annotations

import uuid

import pytest

from tidewater.broker.kafka.delete_topics_plan import NO_TOPIC_ID, plan_delete_topics
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(30)

FOO, BAR, BAZ, SECRET = (uuid.uuid4() for _ in range(4))
NAMES_BY_ID = {FOO.bytes: "foo", BAR.bytes: "bar", BAZ.bytes: "baz", SECRET.bytes: "secret"}


def plan(*entries, deletable=("foo", "bar", "baz", "quux", "gone"), describable=("foo",)):
    return plan_delete_topics(entries, NAMES_BY_ID, lambda n: n in deletable,
                              lambda n: n in describable or n in deletable)


def results(p) -> set[tuple]:
    return {(r["name"], r["topic_id"], r["error_code"], r["error_message"]) for r in p.answered}


def test_kafkas_invalid_shapes_each_get_their_answer_and_nothing_is_deleted():
    # Kafka's ControllerApisTest.testInvalidDeleteTopicsRequest, the same entries.
    p = plan((None, NO_TOPIC_ID), ("foo", FOO), ("bar", NO_TOPIC_ID), (None, BAR),
             ("quux", NO_TOPIC_ID), ("quux", NO_TOPIC_ID), ("quux", NO_TOPIC_ID),
             (None, BAZ), (None, BAZ), (None, BAZ))
    assert results(p) == {
        (None, NO_TOPIC_ID, pb.INVALID_REQUEST, "Neither topic name nor id were specified."),
        ("foo", FOO, pb.INVALID_REQUEST, "You may not specify both topic name and topic id."),
        ("bar", BAR, pb.INVALID_REQUEST,
         "The provided topic name maps to an ID that was already supplied."),
        ("quux", NO_TOPIC_ID, pb.INVALID_REQUEST, "Duplicate topic name."),
        (None, BAZ, pb.INVALID_REQUEST, "Duplicate topic id."),
    }
    assert (p.names, p.topic_ids) == ([], {})


def test_ids_resolve_to_names_sent_with_the_id_names_pass_alone():
    p = plan((None, FOO), ("quux", NO_TOPIC_ID), (None, BAZ))
    assert p.answered == []
    assert p.names == ["quux", "foo", "baz"]
    assert p.topic_ids == {"foo": FOO.bytes, "baz": BAZ.bytes}


def test_unknown_and_unauthorized_ids_reveal_no_name_unless_describable():
    unknown = uuid.uuid4()
    p = plan((None, unknown), (None, SECRET), deletable=(), describable=())
    assert results(p) == {
        (None, unknown, pb.UNKNOWN_TOPIC_ID, "This server does not host this topic ID."),
        (None, SECRET, pb.TOPIC_AUTHORIZATION_FAILED, None)}
    p = plan((None, SECRET), deletable=(), describable=("secret",))
    assert results(p) == {("secret", SECRET, pb.TOPIC_AUTHORIZATION_FAILED, None)}
    assert p.names == []


def test_a_name_the_principal_may_not_delete_is_refused_by_name():
    p = plan(("secret", NO_TOPIC_ID), ("gone", NO_TOPIC_ID))
    assert results(p) == {("secret", NO_TOPIC_ID, pb.TOPIC_AUTHORIZATION_FAILED,
                           "needs DELETE on topic 'secret'")}
    assert p.names == ["gone"]  # unknown names are the controller's to answer
