"""GroupAdmin.plan_reset when ListOffsets leaves partitions out (no leader known yet)."""

import pytest

from tidewater.client.group_admin import GroupAdmin
from tidewater.client.metadata import TopicPartition
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import LeaderNotAvailableError

TPS = [TopicPartition("t", 0), TopicPartition("t", 1)]


class FlakyConsumer:
    """ListOffsets that answers partition 1 only from its ``answers_from``-th call on."""

    def __init__(self, answers_from: int):
        self.answers_from = answers_from
        self.calls = 0

    def _offsets(self, tps, value):
        self.calls += 1
        return {tp: value for tp in tps if tp.partition == 0 or self.calls >= self.answers_from}

    def beginning_offsets(self, tps):
        return self._offsets(tps, 0)

    def end_offsets(self, tps):
        return self._offsets(tps, 10)


def admin_with(consumer, monkeypatch) -> GroupAdmin:
    admin = object.__new__(GroupAdmin)  # no cluster: the coordinator's answers are stubbed
    admin.request_timeout_s = 0.5
    admin.consumer = consumer
    monkeypatch.setattr(admin, "_coordinator", lambda group_id: None)
    monkeypatch.setattr(admin, "_described",
                        lambda c: pb.GroupDescription(group_id="g", state="Empty"))
    monkeypatch.setattr(admin, "_committed", lambda c: {("t", 0): 3, ("t", 1): 4})
    return admin


def test_partitions_left_out_are_asked_again(monkeypatch):
    consumer = FlakyConsumer(answers_from=3)
    admin = admin_with(consumer, monkeypatch)
    planned = admin.plan_reset("g", None, to="offset", offset=20)
    assert planned == {("t", 0): 10, ("t", 1): 10}  # clamped to the end offsets
    assert consumer.calls >= 3


def test_a_partition_never_answered_is_a_typed_error_naming_it(monkeypatch):
    admin = admin_with(FlakyConsumer(answers_from=10**9), monkeypatch)
    with pytest.raises(LeaderNotAvailableError, match=r"no earliest offset of t-1 within"):
        admin.plan_reset("g", None, to="earliest")
