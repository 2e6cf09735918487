"""The end of a BrokerHeartbeats stream as a fencing decision (no sockets, time passed in)."""

from dataclasses import replace

import pytest
from controller_harness import Harness

from tidewater.controller.sessions import BrokerSessions
from tidewater.proto import tidewater_pb2 as pb


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "ctl")
    yield harness
    harness.log.close()


def cluster_with_topic(h):
    for b in (1, 2, 3):
        assert h.register(b).error_code == pb.NONE
    assert h.create("t", partitions=3, rf=3).error_code == pb.NONE
    return h


def beat(h, broker_id, stream_id, *, epoch=None, want_shutdown=False):
    request = pb.BrokerHeartbeatRequest(
        broker_id=broker_id, broker_epoch=h.epochs[broker_id] if epoch is None else epoch,
        want_shutdown=want_shutdown, control_token=h.token(broker_id))
    return h.owner.run_now(lambda tx, now: h.machine.broker_heartbeat(tx, now, request, stream_id))


def closed(h, broker_id, stream_id, *, epoch=None):
    epoch = h.epochs[broker_id] if epoch is None else epoch
    return h.owner.run_now(lambda tx, now: h.machine.heartbeat_stream_closed(
        tx, now, broker_id, epoch, stream_id))


def test_end_of_the_live_stream_fences_like_a_session_expiry(tmp_path):
    by_stream = cluster_with_topic(Harness(tmp_path / "a"))
    by_session = cluster_with_topic(Harness(tmp_path / "b"))
    victim = by_stream.partition("t", 0).leader
    assert beat(by_stream, victim, stream_id=7).error_code == pb.NONE
    by_stream.effects.clear()
    fenced, stream_records = by_stream.owner.run_now(lambda tx, now: (
        by_stream.machine.heartbeat_stream_closed(tx, now, victim, by_stream.epochs[victim], 7),
        tx.records))
    assert fenced is True
    by_session.now_ms += by_session.config.broker_session_timeout_ms + 1
    by_session.heartbeat_all(victim)
    expired, session_records = by_session.owner.run_now(lambda tx, now: (
        by_session.machine.check_sessions(tx, now), tx.records))
    assert expired == [victim]

    # the very same records and decisions as the session expiry
    assert stream_records == session_records
    assert stream_records[-1] == {"type": "broker_fenced", "broker_id": victim}
    assert by_stream.metadata.brokers[victim].fenced
    for number in range(3):
        p = by_stream.partition("t", number)
        assert victim not in p.isr and p.leader not in (victim, -1)
        # Two clusters: the same decisions, each with its own topic id.
        assert replace(p, topic_id=b"") == replace(by_session.partition("t", number), topic_id=b"")
    effects = by_stream.effects[-1]
    assert effects.fenced_brokers == {victim} and effects.leader_elections == 1
    by_session.log.close()
    by_stream.log.close()


def test_end_of_an_old_incarnations_stream_does_not_fence_the_new_one(h):
    cluster_with_topic(h)
    old_epoch = h.epochs[2]
    assert beat(h, 2, stream_id=1).error_code == pb.NONE
    h.register(2, incarnation="restarted")  # the killed process came back first
    assert beat(h, 2, stream_id=2).error_code == pb.NONE
    assert closed(h, 2, 1, epoch=old_epoch) is False
    assert not h.metadata.brokers[2].fenced
    assert closed(h, 2, 2) is True  # its own stream still counts


def test_a_stream_no_longer_carrying_heartbeats_does_not_fence(h):
    cluster_with_topic(h)
    beat(h, 1, stream_id=1)
    beat(h, 1, stream_id=2)  # re-opened after a blip; the old one's end arrives late
    assert closed(h, 1, 1) is False
    h.heartbeat(1)  # bound to no stream (the harness's): stream 2 no longer carries them
    assert closed(h, 1, 2) is False
    assert not h.metadata.brokers[1].fenced


def test_end_after_a_finished_controlled_shutdown_does_not_fence(h):
    cluster_with_topic(h)
    leaving = h.partition("t", 0).leader
    response = beat(h, leaving, stream_id=3, want_shutdown=True)
    assert response.should_shutdown
    assert closed(h, leaving, 3) is False
    assert not h.metadata.brokers[leaving].fenced
    # its session still ends it later
    assert h.advance(h.config.broker_session_timeout_ms + 200, leaving) == [leaving]


def test_sessions_decide_on_the_latest_stream_and_a_finished_shutdown_only():
    sessions = BrokerSessions(3000)
    sessions.touch(1, 0, stream_id=5)
    sessions.begin_controlled_shutdown(1)
    assert sessions.stream_end_fences(1, 5)  # asked to shut down, not told yet: a crash
    sessions.finish_controlled_shutdown(1)
    assert not sessions.stream_end_fences(1, 5)
    sessions.reset(1, 10)  # registered again: no stream yet, no shutdown
    assert not sessions.stream_end_fences(1, 5)
    sessions.touch(1, 20, stream_id=6)
    assert sessions.stream_end_fences(1, 6) and not sessions.stream_end_fences(1, 5)
    sessions.end(1)
    assert not sessions.stream_end_fences(1, 6)


def test_unknown_stale_or_already_fenced_brokers_are_left_alone(h):
    cluster_with_topic(h)
    assert closed(h, 9, 1, epoch=5) is False  # never registered
    beat(h, 3, stream_id=5)
    assert closed(h, 3, 5, epoch=h.epochs[3] - 1) is False  # not its epoch
    assert closed(h, 3, 6) is False  # a stream that never carried its heartbeat
    assert closed(h, 3, 5) is True
    before = h.log.next_offset
    assert closed(h, 3, 5) is False  # fenced already: nothing appended
    assert h.log.next_offset == before


def test_a_fenced_broker_heartbeating_on_a_new_stream_is_unfenced_and_bound_to_it(h):
    cluster_with_topic(h)
    beat(h, 1, stream_id=1)
    assert closed(h, 1, 1) is True
    response = beat(h, 1, stream_id=2)  # a live broker whose stream broke: back at once
    assert response.error_code == pb.NONE and not h.metadata.brokers[1].fenced
    assert closed(h, 1, 1) is False
    assert closed(h, 1, 2) is True
