"""Small pure pieces of the controller: assignment, validation, config, owner, replay errors."""

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.controller.assignment import assign_replicas
from tidewater.controller.config import ControllerConfig
from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.owner import ImageAheadOfDiskError, MetadataOwner
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.controller.validation import validate_topic_configs, validate_topic_name
from tidewater.proto.errors import CorruptFileError, InvalidConfigError, InvalidTopicError
from tidewater.tools.local_cluster import route_settings

# ---------------------------------------------------------------- assignment

@settings(max_examples=100, deadline=None)
@given(brokers=st.lists(st.integers(0, 50), min_size=1, max_size=6, unique=True),
       partitions=st.integers(1, 40), data=st.data())
def test_assignment_is_valid_and_balanced(brokers, partitions, data):
    rf = data.draw(st.integers(1, len(brokers)))
    seq = data.draw(st.integers(0, 100))
    assignment = assign_replicas(brokers, partitions, rf, topic_sequence=seq)
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == rf and len(set(replicas)) == rf and set(replicas) <= set(brokers)
    leaders = Counter(r[0] for r in assignment)
    # leaders differ by at most one partition between brokers
    counts = [leaders.get(b, 0) for b in brokers]
    assert max(counts) - min(counts) <= 1
    replicas_per_broker = Counter(b for r in assignment for b in r)
    counts = [replicas_per_broker.get(b, 0) for b in brokers]
    assert max(counts) - min(counts) <= rf


def test_assignment_start_shifts_with_topic_sequence():
    firsts = {assign_replicas([1, 2, 3], 1, 1, topic_sequence=s)[0][0] for s in range(3)}
    assert firsts == {1, 2, 3}


def test_assignment_rejects_impossible_requests():
    with pytest.raises(ValueError):
        assign_replicas([1, 2], 1, 3, topic_sequence=0)
    with pytest.raises(ValueError):
        assign_replicas([1, 2], 0, 1, topic_sequence=0)


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize("name", ["a", "A-b_c.9", "x" * 249])
def test_good_topic_names(name):
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "../etc", "a/b", "a\\b", "x" * 250, "a b",
                                  "é", "a\x00"])
def test_bad_topic_names(name):
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


def test_topic_configs():
    validate_topic_configs({"min.insync.replicas": "2", "retention.ms": "-1",
                            "retention.bytes": "-1", "segment.bytes": "1048576",
                            "message.timestamp.type": "LogAppendTime",
                            "unclean.leader.election.enable": "TRUE",
                            "cleanup.policy": "delete", "flush.messages": "1", "flush.ms": "0",
                            "index.interval.bytes": "4096", "max.message.bytes": "1000",
                            "segment.ms": "1000"})
    for bad in ({"segment.bytes": "13"}, {"retention.ms": "-2"}, {"flush.messages": "0"},
                {"max.message.bytes": "1.5"}, {"compression.type": "brotli"}):
        with pytest.raises(InvalidConfigError):
            validate_topic_configs(bad)


# ---------------------------------------------------------------- config

def test_settings_by_kafka_name():
    config = ControllerConfig()
    config.apply_settings(["broker.session.timeout.ms=1500", "unclean.leader.election.enable=true",
                           "num.partitions=3", "leader.imbalance.check.interval.seconds=0.5"])
    assert config.broker_session_timeout_ms == 1500 and config.unclean_leader_election_enable
    assert config.num_partitions == 3 and config.leader_imbalance_check_interval_seconds == 0.5
    assert config.unclean_allowed({}) is True
    assert config.unclean_allowed({"unclean.leader.election.enable": "false"}) is False


@pytest.mark.parametrize("item", ["nope=1", "num.partitions", "num.partitions=0",
                                  "broker.session.timeout.ms=x",
                                  "unclean.leader.election.enable=maybe",
                                  "max.connections=0", "max.connections=x",
                                  "connections.max.idle.ms=-1",
                                  # gRPC's channel arguments are C ints
                                  "connections.max.idle.ms=2147483648",
                                  "max.connections=2147483648"])
def test_bad_settings(item):
    with pytest.raises(InvalidConfigError):
        ControllerConfig().apply_settings([item])


def test_connection_settings_reach_both_ports_and_tide_cluster_routes_them_to_all():
    """max.connections and connections.max.idle.ms: the controller's port, and the Raft
    port through the quorum config; ``tide cluster up --set`` gives them to every process."""
    assert ControllerConfig().max_connections == 1_000  # a bound, unlike Kafka's default
    config = ControllerConfig()
    config.apply_settings(["max.connections=5", "connections.max.idle.ms=2000", "node.id=1",
                           "controller.quorum.voters=1@127.0.0.1:9093"])
    assert (config.max_connections, config.connections_max_idle_ms) == (5, 2000)
    quorum = config.quorum_config()
    assert (quorum.max_connections, quorum.connections_max_idle_ms) == (5, 2000)
    settings = {"max.connections": "5", "connections.max.idle.ms": "2000"}
    assert route_settings(settings) == (settings, settings)


# ---------------------------------------------------------------- owner

def make_owner(tmp_path, commits, fatal=None):
    fatal = [] if fatal is None else fatal
    log = MetadataLog.open(tmp_path)
    machine = ControllerStateMachine(ControllerConfig(data_dir=tmp_path))
    return MetadataOwner(log, machine, on_commit=commits.append, on_fatal=fatal.append,
                         clock_ms=lambda: 0), log


async def test_owner_runs_commands_in_order_and_answers_after_the_write(tmp_path):
    commits = []
    owner, log = make_owner(tmp_path, commits)
    task = asyncio.get_running_loop().create_task(owner.run())
    try:
        def command(n):
            def run(tx, now_ms):
                tx.append({"type": "cluster", "cluster_id": f"c{n}"})
                return log.next_offset  # before the write
            return run
        results = await asyncio.gather(*(owner.submit(command(n)) for n in range(5)))
        assert results == [0, 1, 2, 3, 4]
        assert log.next_offset == 5 and len(commits) == 5
        assert owner.machine.metadata.cluster_id == "c4"

        def refuse(tx, now_ms):
            raise InvalidConfigError("no")
        with pytest.raises(InvalidConfigError):
            await owner.submit(refuse)
        assert not task.done()  # a failure before appending only fails its caller
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        log.close()


async def test_owner_stops_when_a_command_fails_after_appending(tmp_path):
    owner, log = make_owner(tmp_path, [])
    task = asyncio.get_running_loop().create_task(owner.run())

    def broken(tx, now_ms):
        tx.append({"type": "cluster", "cluster_id": "x"})
        raise RuntimeError("bug")
    with pytest.raises(Exception, match="metadata owner failed"):
        await owner.submit(broken)
    with pytest.raises(ImageAheadOfDiskError):
        await task
    assert log.next_offset == 0  # nothing half-done reached the disk
    with pytest.raises(Exception, match="shutting down"):
        await owner.submit(lambda tx, now: None)
    log.close()


# ---------------------------------------------------------------- replay errors

def test_replay_refuses_records_that_do_not_fit():
    metadata = ClusterMetadata()
    with pytest.raises(CorruptFileError):
        metadata.apply(0, {"type": "mystery"})
    with pytest.raises(CorruptFileError):
        metadata.apply(0, {"type": "broker_fenced", "broker_id": 1})  # never registered
    with pytest.raises(CorruptFileError):
        metadata.apply(0, {"type": "partition_changed", "topic": "t", "partition": 0})
    metadata.apply(0, {"type": "controller_epoch", "epoch": 3})
    with pytest.raises(CorruptFileError):
        metadata.apply(1, {"type": "controller_epoch", "epoch": 3})


@pytest.mark.parametrize("kind", [["cluster"], {"cluster": 1}, 7, None])
def test_replay_refuses_a_record_type_that_is_not_a_name(kind):
    # Any JSON value can stand where the type's name should: an unhashable one must
    # be reported as corruption too, not escape replay as a TypeError.
    with pytest.raises(CorruptFileError, match="unknown metadata record type"):
        ClusterMetadata().apply(0, {"type": kind, "cluster_id": "c"})


# ---------------------------------------------------------------- metrics

def test_metrics_follow_committed_changes(tmp_path):
    from controller_harness import Harness

    from tidewater.controller.metrics import ControllerMetrics

    h = Harness(tmp_path / "ctl", settings=["unclean.leader.election.enable=true"])
    metrics = ControllerMetrics()
    h.owner._on_commit = lambda effects: metrics.on_commit(h.machine, effects)

    def value(name):
        return metrics.registry.get_sample_value("tidewater_controller_" + name) or 0.0

    for b in (1, 2):
        h.register(b)
    h.create("t", partitions=2, rf=2)
    h.create("solo", partitions=1, rf=1)
    assert value("partitions") == 3 and value("topics") == 2 and value("registered_brokers") == 2
    solo_leader = h.partition("solo").leader
    h.advance(3500, solo_leader)
    assert value("fenced_brokers") == 1
    assert value("offline_partitions") == 1  # solo has no other replica
    assert value("under_replicated_partitions") == 2  # both partitions of t lost a replica
    assert value("leader_elections_total") >= 2  # t's partition led by the lost broker + solo
    assert value("isr_changes_total") >= 1
    p = h.partition("t", 0)
    leader = p.leader
    follower = next(r for r in p.replicas if r != leader)
    h.heartbeat(solo_leader)  # back: solo has its leader again
    assert value("offline_partitions") == 0
    # the returning broker is not back in t's ISRs: losing t's only ISR member now
    # makes both partitions elect it uncleanly
    assert h.partition("t", 0).isr == (leader,) and h.partition("t", 1).isr == (leader,)
    h.advance(3500, leader)
    assert value("unclean_leader_elections_total") == 2
    assert h.partition("t", 0).leader == follower == h.partition("t", 1).leader
    h.log.close()
