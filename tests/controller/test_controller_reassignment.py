"""Partition reassignment (KIP-455) in the controller: commands on a real metadata log,
no sockets (``controller/reassignment.py``, ``state_machine.alter_partition_reassignments``)."""

import pytest
from controller_harness import Harness

from tidewater.controller.metadata import ClusterMetadata
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "ctl")
    for b in (1, 2, 3, 4):
        assert harness.register(b).error_code == pb.NONE
    created = harness.run(harness.machine.create_topics, pb.CreateTopicsRequest(topics=[
        pb.CreatableTopic(name="t", num_partitions=-1, replication_factor=-1, assignments=[
            pb.ReplicaList(partition=0, broker_ids=[1, 2, 3])])]))
    assert created.topics[0].error_code == pb.NONE, created
    yield harness
    harness.log.close()


def reassign(h, replicas, *, cancel=False, topic="t", partition=0, keep_rf=False):
    response = h.run(h.machine.alter_partition_reassignments,
                     pb.AlterPartitionReassignmentsRequest(
                         keep_replication_factor=keep_rf,
                         partitions=[pb.PartitionReassignment(
                             topic=topic, partition=partition, replicas=replicas or [],
                             cancel=cancel)]))
    [result] = response.results
    return result


def ongoing(h):
    response = h.run(h.machine.list_partition_reassignments,
                     pb.ListPartitionReassignmentsRequest(all_partitions=True))
    return {(r.topic, r.partition): (list(r.replicas), list(r.adding_replicas),
                                     list(r.removing_replicas))
            for r in response.reassignments}


def stops(h):
    return [(b, [(p.topic, p.partition) for p in ps])
            for e in h.effects for b, ps in e.stop_replicas]


def test_move_adds_then_switches_after_catch_up_and_stops_the_old_replica(h):
    before = h.partition("t")
    assert before.leader == 1
    assert reassign(h, [2, 3, 4]).error_code == pb.NONE
    p = h.partition("t")
    # The union, target first; the ISR and leader stay until the new replica caught up.
    assert (p.replicas, p.adding, p.removing) == ((2, 3, 4, 1), (4,), (1,))
    assert p.isr == before.isr and p.leader == 1
    assert ongoing(h) == {("t", 0): ([2, 3, 4, 1], [4], [1])}
    assert stops(h) == []
    # Durable: a restarted controller still has it ongoing.
    h2 = h.restart()
    assert ongoing(h2) == {("t", 0): ([2, 3, 4, 1], [4], [1])}
    h2.epochs = dict(h.epochs)
    h2.effects.clear()
    # The leader adds broker 4 to the ISR: the move completes in the same command.
    p = h2.partition("t")
    assert h2.alter(1, p, [1, 2, 3, 4]).error_code == pb.NONE
    done = h2.partition("t")
    assert (done.replicas, done.isr, done.adding, done.removing) == ((2, 3, 4), (2, 3, 4), (),
                                                                    ())
    assert done.leader == 2 and done.leader_epoch == p.leader_epoch + 1
    assert ongoing(h2) == {}
    assert stops(h2) == [(1, [("t", 0)])]
    h3 = h2.restart()
    assert h3.partition("t") == done
    h3.log.close()
    h2.log.close()


def test_cancel_reverts_and_a_second_cancel_is_no_reassignment_in_progress(h):
    assert reassign(h, [2, 3, 4]).error_code == pb.NONE
    assert reassign(h, None, cancel=True).error_code == pb.NONE
    p = h.partition("t")
    # Kafka's revert: the union without the adding ones, in the union's order.
    assert (p.replicas, p.adding, p.removing, p.leader) == ((2, 3, 1), (), (), 1)
    assert ongoing(h) == {}
    assert stops(h) == [(4, [("t", 0)])]  # the replica that was being added goes
    again = reassign(h, None, cancel=True)
    assert again.error_code == pb.NO_REASSIGNMENT_IN_PROGRESS


def test_a_new_target_replaces_the_ongoing_one_from_the_original_replicas(h):
    assert reassign(h, [2, 3, 4]).error_code == pb.NONE
    assert reassign(h, [4, 1, 2]).error_code == pb.NONE
    p = h.partition("t")
    assert (p.replicas, p.adding, p.removing) == ((4, 1, 2, 3), (4,), (3,))


def test_removing_only_completes_at_once_and_moves_leadership(h):
    result = reassign(h, [2, 3])
    assert result.error_code == pb.NONE
    p = h.partition("t")
    assert (p.replicas, p.isr, p.leader, p.adding, p.removing) == ((2, 3), (2, 3), 2, (), ())
    assert stops(h) == [(1, [("t", 0)])]


@pytest.mark.parametrize("replicas, code, fragment", [
    ([2, 3, 9], pb.INVALID_REPLICA_ASSIGNMENT, "no such broker"),
    ([2, 2, 3], pb.INVALID_REPLICA_ASSIGNMENT, "twice"),
    ([], pb.INVALID_REPLICA_ASSIGNMENT, "empty replica list"),
])
def test_bad_targets_get_kafkas_errors_and_change_nothing(h, replicas, code, fragment):
    before = h.partition("t")
    result = reassign(h, replicas)
    assert result.error_code == code and fragment in result.error_message
    assert h.partition("t") == before


def test_unknown_partition_and_a_replication_factor_change_when_not_allowed(h):
    assert reassign(h, [1, 2], partition=5).error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert reassign(h, [1, 2], topic="nope").error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert reassign(h, [1, 2], keep_rf=True).error_code == pb.INVALID_REPLICATION_FACTOR
    listed = h.run(h.machine.list_partition_reassignments, pb.ListPartitionReassignmentsRequest(
        partitions=[pb.TopicPartitionName(topic="nope", partition=0)]))
    assert listed.error_code == pb.UNKNOWN_TOPIC_OR_PARTITION


def test_a_snapshot_mid_reassignment_rebuilds_the_same_partition(h):
    assert reassign(h, [2, 3, 4]).error_code == pb.NONE
    image = ClusterMetadata()
    for offset, record in enumerate(h.metadata.snapshot_records()):
        image.apply(offset, record)
    assert image.partition("t", 0) == h.partition("t")


def test_partitions_added_mid_reassignment_keep_the_topics_replication_factor(h):
    assert reassign(h, [2, 3, 4]).error_code == pb.NONE
    assert len(h.partition("t").replicas) == 4  # the union
    grown = h.run(h.machine.create_partitions, pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="t", count=2)]))
    assert grown.topics[0].error_code == pb.NONE, grown
    assert len(h.partition("t", 1).replicas) == 3


def test_a_fenced_replica_removed_gets_its_stop_when_back_unless_it_was_given_back(h):
    # Broker 3 is fenced; a move drops it (removing-only: done at once).
    h.advance(h.config.broker_session_timeout_ms + 200, 3)
    assert h.metadata.brokers[3].fenced
    assert reassign(h, [1, 2]).error_code == pb.NONE
    assert h.partition("t").replicas == (1, 2)
    assert stops(h) == []  # it is fenced: remembered instead
    h2 = h.restart()  # durable
    h2.epochs = dict(h.epochs)
    h2.effects.clear()
    assert h2.heartbeat(3).error_code == pb.NONE  # back: the stop goes out
    assert stops(h2) == [(3, [("t", 0)])]
    # Removed while fenced, then given back before it returned: nothing to stop.
    h2.advance(h2.config.broker_session_timeout_ms + 200, 4)
    assert reassign(h2, [1, 2, 4]).error_code == pb.NONE  # adds 4 (fenced): in progress
    assert reassign(h2, [1, 2]).error_code == pb.NONE  # reverted: 4 removed, fenced
    assert reassign(h2, [1, 2, 4]).error_code == pb.NONE  # and given back
    h2.effects.clear()
    assert h2.heartbeat(4).error_code == pb.NONE
    assert stops(h2) == []
    h2.log.close()
