"""The senders' core (controller/send_marks.py): marks, request order, put-back, backoff.

Driven synchronously over a real image (the harness's state machine); no gRPC.
"""

import pytest
from controller_harness import Harness

from tidewater.controller.send_marks import (
    LEADER_AND_ISR,
    STOP_REPLICA,
    UPDATE_METADATA,
    RetryBackoff,
    SendMarks,
    route_effects,
)
from tidewater.controller.state_machine import Effects
from tidewater.proto import tidewater_pb2 as pb


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "ctl")
    for broker_id in (1, 2, 3):
        assert harness.register(broker_id).error_code == pb.NONE
    assert harness.create("t", partitions=3, rf=3).error_code == pb.NONE
    yield harness
    harness.log.close()


def take_all(marks, h):
    taken = []
    while (outgoing := marks.take_next(h.metadata, 0, h.machine.sessions)) is not None:
        taken.append(outgoing)
    return taken


def test_requests_go_stop_then_leader_and_isr_then_metadata(h):
    marks = SendMarks(1)
    marks.mark_metadata()
    marks.mark_partitions([("t", 2), ("t", 0)], new={("t", 0)})
    marks.mark_stop([h.partition("t", 1)], h.metadata)  # still hosted: its mark stays
    taken = take_all(marks, h)
    assert [o.kind for o in taken] == [STOP_REPLICA, LEADER_AND_ISR, UPDATE_METADATA]
    states = taken[1].request.partitions
    assert [(s.state.partition, s.is_new) for s in states] == [(0, True), (2, False)]
    assert marks.idle


def test_a_stop_drops_the_stale_leader_and_isr_mark(h):
    marks = SendMarks(1)
    marks.mark_partitions([("t", 0)])
    record = h.partition("t", 0)
    h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["t"]))
    marks.mark_stop([record], h.metadata)
    assert [o.kind for o in take_all(marks, h)] == [STOP_REPLICA]


def test_marks_of_partitions_no_longer_hosted_send_nothing(h):
    marks = SendMarks(1)
    marks.mark_partitions([("t", 0)])
    h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["t"]))
    assert take_all(marks, h) == [] and marks.idle


def test_a_failed_request_puts_its_marks_back_merged_with_newer_ones(h):
    marks = SendMarks(1)
    marks.mark_partitions([("t", 0)], new={("t", 0)})
    outgoing = marks.take_next(h.metadata, 0, h.machine.sessions)
    assert outgoing.kind == LEADER_AND_ISR and marks.idle
    marks.mark_partitions([("t", 0), ("t", 1)])  # set while it was in flight
    marks.put_back(outgoing)
    states = marks.take_next(h.metadata, 0, h.machine.sessions).request.partitions
    assert [(s.state.partition, s.is_new) for s in states] == [(0, True), (1, False)]
    update = SendMarks(1)
    update.mark_metadata()
    sent = update.take_next(h.metadata, 0, h.machine.sessions)
    update.put_back(sent)
    assert [o.kind for o in take_all(update, h)] == [UPDATE_METADATA]


def test_backoff_doubles_to_its_cap_and_resets_on_success():
    backoff = RetryBackoff(100, 350)
    assert backoff.may_send(0)
    assert [backoff.failed(1000), backoff.failed(2000), backoff.failed(3000)] == [100, 200, 350]
    assert not backoff.may_send(3349) and backoff.may_send(3350)
    backoff.succeeded()
    assert backoff.failed(4000) == 100


class Recorder:
    def __init__(self, broker_id, metadata):
        self.marks = SendMarks(broker_id)
        self.metadata = metadata

    def mark_partitions(self, tps, *, new=frozenset()):
        self.marks.mark_partitions(tps, new=new)

    def mark_metadata(self):
        self.marks.mark_metadata()

    def mark_stop(self, partitions):
        self.marks.mark_stop(partitions, self.metadata)


def test_route_effects_drops_fenced_and_resyncs_new_registrations(h):
    senders = {1: Recorder(1, h.metadata), 2: Recorder(2, h.metadata)}
    dropped = []

    def ensure(broker_id):
        return senders.setdefault(broker_id, Recorder(broker_id, h.metadata))

    def drop(broker_id):
        dropped.append(broker_id)
        senders.pop(broker_id)

    effects = Effects(fenced_brokers={2}, resync_brokers={3},
                                      changed_partitions={("t", 0)}, metadata_changed=True)
    route_effects(effects, h.metadata, senders, drop_sender=drop, ensure_sender=ensure)
    assert dropped == [2] and set(senders) == {1, 3}
    resynced = take_all(senders[3].marks, h)
    assert [o.kind for o in resynced] == [LEADER_AND_ISR, UPDATE_METADATA]
    assert len(resynced[0].request.partitions) == 3  # everything broker 3 hosts
    changed = take_all(senders[1].marks, h)
    assert [o.kind for o in changed] == [LEADER_AND_ISR, UPDATE_METADATA]
    assert [s.state.partition for s in changed[0].request.partitions] == [0]
