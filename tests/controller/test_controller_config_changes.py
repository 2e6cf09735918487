"""AlterConfigs, IncrementalAlterConfigs and ElectLeaders in the controller, on a real
metadata log: the rules of ``controller/config_changes.py``, replay, and elections."""

import pytest
from controller_harness import Harness

from tidewater.controller.election import NO_LEADER
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(60)

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "ctl")
    for b in (1, 2, 3):
        assert harness.register(b).error_code == pb.NONE
    yield harness
    harness.log.close()


def alter(h, *resources, incremental=True, validate_only=False):
    request = pb.AlterConfigsRequest(incremental=incremental, validate_only=validate_only)
    for resource_type, name, alterations in resources:
        request.resources.add(resource_type=resource_type, resource_name=name, alterations=[
            pb.ConfigAlteration(name=n, operation=op, value=v or "", value_null=v is None)
            for n, op, v in alterations])
    return [(r.error_code, r.error_message)
            for r in h.run(h.machine.alter_configs, request).results]


def test_incremental_set_delete_append_subtract_and_replay(h):
    assert h.create("t", partitions=2, rf=2).error_code == pb.NONE
    [(code, _)] = alter(h, (TOPIC, "t", [("retention.ms", SET, "1000"),
                                         ("cleanup.policy", APPEND, "compact")]))
    assert code == pb.NONE
    assert h.metadata.topics["t"].configs == {"min.insync.replicas": "1",
                                              "retention.ms": "1000",
                                              "cleanup.policy": "delete,compact"}
    # the change reaches every replica: a LeaderAndIsr for each partition
    assert {("t", 0), ("t", 1)} <= h.effects[-1].changed_partitions
    [(code, _)] = alter(h, (TOPIC, "t", [("cleanup.policy", SUBTRACT, "delete"),
                                         ("retention.ms", DELETE, None)]))
    assert code == pb.NONE
    assert h.metadata.topics["t"].configs == {"min.insync.replicas": "1",
                                              "cleanup.policy": "compact"}
    h2 = h.restart()
    assert h2.metadata.topics["t"].configs == {"min.insync.replicas": "1",
                                               "cleanup.policy": "compact"}
    h2.log.close()


def test_legacy_alter_configs_replaces_every_own_config(h):
    h.create("t")
    [(code, _)] = alter(h, (TOPIC, "t", [("segment.bytes", SET, "1048576")]),
                        incremental=False)
    assert code == pb.NONE
    assert h.metadata.topics["t"].configs == {"segment.bytes": "1048576"}


def test_refusals_per_resource_and_nothing_changes(h):
    h.create("t")
    h.create("u")
    before = dict(h.metadata.topics["t"].configs)
    results = alter(
        h,
        (TOPIC, "t", [("retention.ms", SET, "1000"), ("max.message.bytes", SET, "-5")]),
        (TOPIC, "nope", [("retention.ms", SET, "1")]),
        (TOPIC, "u", [("retention.ms", APPEND, "5")]),
        (TOPIC, "u", [("retention.ms", SET, "5")]),
        (BROKER, "1", [("broker.rack", SET, "r1")]),
        (BROKER, "9", [("log.retention.ms", SET, "5")]),
        (7, "x", [("a", SET, "b")]))
    codes = [code for code, _ in results]
    assert codes == [pb.INVALID_CONFIG, pb.UNKNOWN_TOPIC_OR_PARTITION, pb.INVALID_REQUEST,
                     pb.INVALID_REQUEST, pb.INVALID_REQUEST, pb.INVALID_REQUEST,
                     pb.INVALID_REQUEST]
    assert "max.message.bytes" in results[0][1]
    assert "dynamically" in results[4][1]
    assert h.metadata.topics["t"].configs == before
    [(code, message)] = alter(h, (TOPIC, "u", [("retention.ms", APPEND, "5")]))
    assert code == pb.INVALID_CONFIG and "append" in message
    [(code, _)] = alter(h, (TOPIC, "u", [("retention.ms", SET, "1"),
                                         ("retention.ms", DELETE, None)]))
    assert code == pb.INVALID_REQUEST  # a key twice in one resource
    [(code, _)] = alter(h, (TOPIC, "u", [("nonsense.config", SET, "1")]))
    assert code == pb.INVALID_CONFIG


def test_validate_only_appends_nothing(h):
    h.create("t")
    offset = h.metadata.last_offset
    assert alter(h, (TOPIC, "t", [("retention.ms", SET, "5")]), validate_only=True) == [
        (pb.NONE, "")]
    assert h.metadata.last_offset == offset and "retention.ms" not in h.metadata.topics["t"].configs


def test_dynamic_broker_configs_per_broker_and_cluster_wide_survive_compaction(h):
    results = alter(h, (BROKER, "", [("log.retention.ms", SET, "60000"),
                                     ("unclean.leader.election.enable", SET, "true")]),
                    (BROKER, "2", [("message.max.bytes", SET, "2000")]))
    assert [code for code, _ in results] == [pb.NONE, pb.NONE]
    assert h.metadata.broker_configs == {
        "": {"log.retention.ms": "60000", "unclean.leader.election.enable": "true"},
        "2": {"message.max.bytes": "2000"}}
    [(code, message)] = alter(h, (BROKER, "", [("log.retention.ms", SET, "soon")]))
    assert code == pb.INVALID_CONFIG and "log.retention.ms" in message
    # the snapshot records rebuild the same image
    from tidewater.controller.metadata import ClusterMetadata
    rebuilt = ClusterMetadata()
    for offset, record in enumerate(h.metadata.snapshot_records()):
        rebuilt.apply(offset, record)
    assert rebuilt.broker_configs == h.metadata.broker_configs
    [(code, _)] = alter(h, (BROKER, "2", [("message.max.bytes", DELETE, None)]))
    assert code == pb.NONE and "2" not in h.metadata.broker_configs


def test_cluster_wide_unclean_default_lets_an_election_go_outside_the_isr(h):
    h.create("t", rf=2)
    p = h.metadata.partition("t", 0)
    follower = next(r for r in p.replicas if r != p.leader)
    # the follower leaves the ISR, then the leader goes: offline without unclean elections
    assert h.alter(p.leader, p, [p.leader]).error_code == pb.NONE
    h.advance(4000, p.leader)
    assert h.metadata.partition("t", 0).leader == NO_LEADER
    assert h.owner.run_now(h.machine.elect_offline) == 0
    alter(h, (BROKER, "", [("unclean.leader.election.enable", SET, "true")]))
    assert h.owner.run_now(h.machine.elect_offline) == 1
    assert h.metadata.partition("t", 0).leader == follower


def test_elect_leaders_preferred_and_unclean(h):
    h.create("t", rf=2)
    p = h.metadata.partition("t", 0)
    preferred, other = p.replicas
    name = pb.TopicPartitionName(topic="t", partition=0)
    response = h.run(h.machine.elect_leaders, pb.ElectLeadersRequest(
        election_type=0, partitions=[name, pb.TopicPartitionName(topic="t", partition=5)]))
    assert [r.error_code for r in response.results] == [pb.ELECTION_NOT_NEEDED,
                                                         pb.UNKNOWN_TOPIC_OR_PARTITION]
    # all partitions: those that need nothing are left out
    response = h.run(h.machine.elect_leaders, pb.ElectLeadersRequest(
        election_type=0, all_partitions=True))
    assert list(response.results) == []
    # the preferred replica goes; the other leads; it comes back: preferred election
    h.advance(4000, preferred)
    assert h.metadata.partition("t", 0).leader == other
    response = h.run(h.machine.elect_leaders, pb.ElectLeadersRequest(
        election_type=0, partitions=[name]))
    assert [r.error_code for r in response.results] == [pb.PREFERRED_LEADER_NOT_AVAILABLE]
    # unclean: the leader lives, nothing to do
    response = h.run(h.machine.elect_leaders, pb.ElectLeadersRequest(
        election_type=1, partitions=[name]))
    assert [r.error_code for r in response.results] == [pb.ELECTION_NOT_NEEDED]
    # the ISR shrinks to the other replica, which then goes: offline; the preferred
    # replica (out of the ISR) comes back and only an unclean election makes it lead
    current = h.metadata.partition("t", 0)
    assert h.alter(other, current, [other]).error_code == pb.NONE
    h.register(preferred, incarnation="inc-2")
    h.advance(4000, other)
    assert h.metadata.partition("t", 0).leader == NO_LEADER
    response = h.run(h.machine.elect_leaders, pb.ElectLeadersRequest(
        election_type=1, partitions=[name]))
    assert [r.error_code for r in response.results] == [pb.NONE]
    after = h.metadata.partition("t", 0)
    assert (after.leader, after.isr) == (preferred, (preferred,))
    assert h.metadata.unclean_elections_total == 1


# ---------------------------------------------------------------- manual assignments

def create_assigned(h, name, assignment, **sizes):
    return h.run(h.machine.create_topics, pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
        name=name, num_partitions=sizes.get("partitions", -1),
        replication_factor=sizes.get("rf", -1),
        assignments=[pb.ReplicaList(partition=i, broker_ids=r)
                     for i, r in enumerate(assignment)])])).topics[0]


def test_create_topics_with_a_manual_assignment_and_kafkas_refusals(h):
    created = create_assigned(h, "placed", [[3, 1], [2, 3]])
    assert (created.error_code, created.num_partitions, created.replication_factor) == (
        pb.NONE, 2, 2)
    p0, p1 = (h.metadata.partition("placed", n) for n in (0, 1))
    assert (p0.replicas, p0.leader, p1.replicas, p1.leader) == ((3, 1), 3, (2, 3), 2)
    for assignment, code, sizes in [
            ([[1, 1]], pb.INVALID_REPLICA_ASSIGNMENT, {}),
            ([[1, 9]], pb.INVALID_REPLICA_ASSIGNMENT, {}),
            ([[1, 2], [3]], pb.INVALID_REPLICA_ASSIGNMENT, {}),
            ([[]], pb.INVALID_REPLICA_ASSIGNMENT, {}),
            ([[1, 2]], pb.INVALID_REQUEST, {"partitions": 1})]:
        assert create_assigned(h, "refused", assignment, **sizes).error_code == code
    assert "refused" not in h.metadata.topics


def test_create_partitions_with_a_manual_assignment(h):
    h.create("grow", partitions=1, rf=2)

    def grow(count, assignment):
        return h.run(h.machine.create_partitions, pb.CreatePartitionsRequest(topics=[
            pb.CreatePartitionsTopic(name="grow", count=count, assignments=[
                pb.ReplicaList(broker_ids=r) for r in assignment])])).topics[0].error_code
    assert grow(3, [[1, 2]]) == pb.INVALID_REPLICA_ASSIGNMENT  # 2 new, 1 assignment
    assert grow(2, [[1, 2, 3]]) == pb.INVALID_REPLICA_ASSIGNMENT  # the topic has rf 2
    assert grow(2, [[3, 3]]) == pb.INVALID_REPLICA_ASSIGNMENT
    assert grow(3, [[3, 1], [2, 1]]) == pb.NONE
    assert [h.metadata.partition("grow", n).replicas for n in (1, 2)] == [(3, 1), (2, 1)]


def test_a_cluster_wide_min_insync_replicas_is_what_new_topics_get(h):
    alter(h, (BROKER, "", [("min.insync.replicas", SET, "2")]))
    h.create("later", rf=3)
    assert h.metadata.topics["later"].configs["min.insync.replicas"] == "2"
