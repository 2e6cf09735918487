"""Controller commands on a real metadata log, without sockets: time is passed in."""

import pytest
from controller_harness import Harness

from tidewater.controller.election import NO_LEADER
from tidewater.proto import tidewater_pb2 as pb


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "ctl")
    yield harness
    harness.log.close()


def three_brokers(h):
    for b in (1, 2, 3):
        assert h.register(b).error_code == pb.NONE
    return h


# ---------------------------------------------------------------- start-up

def test_start_creates_cluster_id_and_bumps_controller_epoch_on_restart(h):
    assert h.metadata.controller_epoch == 1 and len(h.metadata.cluster_id) == 32
    cluster_id = h.metadata.cluster_id
    h2 = h.restart()
    assert h2.metadata.controller_epoch == 2 and h2.metadata.cluster_id == cluster_id
    h2.log.close()


# ---------------------------------------------------------------- registration

def test_each_registration_gets_a_larger_epoch(h):
    e1 = h.register(1).broker_epoch
    e2 = h.register(2).broker_epoch
    h.end_session(1)
    e1b = h.register(1, incarnation="inc-2").broker_epoch
    assert 0 < e1 < e2 < e1b
    response = h.register(1, incarnation="inc-2")
    assert response.broker_epoch > e1b
    assert response.controller_epoch == 1 and response.cluster_id == h.metadata.cluster_id


def test_zombie_with_old_epoch_gets_stale_broker_epoch(h):
    old = h.register(1).broker_epoch
    h.end_session(1)
    h.register(1, incarnation="inc-2")
    assert h.heartbeat(1, epoch=old).error_code == pb.STALE_BROKER_EPOCH
    assert h.heartbeat(1).error_code == pb.NONE
    assert h.heartbeat(7, epoch=old).error_code == pb.STALE_BROKER_EPOCH  # never registered


def test_each_registration_gets_its_own_control_token_that_survives_a_restart(h):
    first = h.register(1)
    h.end_session(1)
    second = h.register(1, incarnation="inc-2")
    other = h.register(2)
    tokens = [first.control_token, second.control_token, other.control_token]
    assert all(len(t) == 16 for t in tokens) and len(set(tokens)) == 3
    assert h.token(1) == second.control_token
    # The controller's requests to the broker carry it (the broker checks it).
    from tidewater.controller import requests
    assert requests.update_metadata(h.metadata, 0, 1).control_token == second.control_token
    assert requests.stop_replica(h.metadata, 0, 2, [], delete=True).control_token == \
        other.control_token
    # A new controller replays it from the log: brokers keep working with it.
    h2 = h.restart()
    assert h2.token(1) == second.control_token and h2.token(2) == other.control_token
    assert h2.heartbeat(1, epoch=second.broker_epoch, token=second.control_token).error_code \
        == pb.NONE
    h2.log.close()


def test_a_brokers_rack_is_kept_sent_and_replayed(h):
    """broker.rack: in the registration record, UpdateMetadata and DescribeCluster; a
    restarted controller replays it, and so does one after compaction."""
    from tidewater.controller import requests
    from tidewater.controller.metadata import ClusterMetadata

    assert h.register(1, rack="rack-a").error_code == pb.NONE
    assert h.register(2).error_code == pb.NONE  # no rack
    assert h.register(3, rack="x" * 65).error_code == pb.INVALID_REQUEST
    assert h.register(3, rack="has space").error_code == pb.INVALID_REQUEST
    assert 3 not in h.metadata.brokers

    def racks(metadata):
        sent = requests.update_metadata(metadata, 0, 1)
        return {b.broker_id: b.rack for b in sent.brokers}

    assert racks(h.metadata) == {1: "rack-a", 2: ""}
    h2 = h.restart()
    assert racks(h2.metadata) == {1: "rack-a", 2: ""}
    h2.log.rewrite(h2.metadata.snapshot_records())  # what compaction writes
    h3 = h2.restart()
    assert racks(h3.metadata) == {1: "rack-a", 2: ""}
    # A broker that comes back in another rack: its new registration has the new one.
    h3.end_session(1)
    assert h3.register(1, incarnation="inc-2", rack="rack-b").error_code == pb.NONE
    assert racks(h3.metadata) == {1: "rack-b"}  # 2 went silent too: fenced, not sent
    h3.log.close()
    # A record written before racks existed has no such field: it loads with none.
    old = ClusterMetadata()
    old.apply(1, {"type": "broker_registered", "broker_id": 4, "incarnation_id": "i",
                  "listeners": [["INTERNAL", "127.0.0.1", 9]]})
    assert old.brokers[4].rack == ""


def test_requests_without_the_registrations_token_change_nothing(h):
    """Issue 18: broker epochs are no secret (DescribeCluster lists them). A heartbeat,
    AlterPartition or ReportCorruptReplica with the right epoch but not the
    registration's token is CLUSTER_AUTHORIZATION_FAILED and appends nothing: it neither
    keeps a dead broker's session alive, nor starts a controlled shutdown, nor changes
    an ISR or a leader."""
    three_brokers(h)
    h.create("t", rf=3)
    p = h.partition("t")
    before = (h.metadata.last_offset, h.partition("t"))
    for wrong in (b"", b"\0" * 16, h.token(p.leader)[:-1] + b"!", h.token(p.replicas[1])):
        beat = h.heartbeat(p.leader, want_shutdown=True, token=wrong)
        assert beat.error_code == pb.CLUSTER_AUTHORIZATION_FAILED and beat.is_fenced
        assert h.alter(p.leader, p, [p.leader], token=wrong).error_code == \
            pb.CLUSTER_AUTHORIZATION_FAILED
        assert report_corrupt(h, p.leader, p, token=wrong).error_code == \
            pb.CLUSTER_AUTHORIZATION_FAILED
    assert (h.metadata.last_offset, h.partition("t")) == before
    assert not h.machine.sessions.in_controlled_shutdown(p.leader)
    # A silent broker is fenced even while someone forges its heartbeats.
    h.now_ms += h.config.broker_session_timeout_ms + 1
    h.heartbeat(p.leader, token=b"")
    assert p.leader in h.owner.run_now(h.machine.check_sessions)
    # The epoch check comes first: a zombie with its old token is told to register again.
    old_epoch, old_token = h.epochs[2], h.token(2)
    h.register(2, incarnation="inc-2")
    assert h.heartbeat(2, epoch=old_epoch, token=old_token).error_code == pb.STALE_BROKER_EPOCH


@pytest.mark.parametrize("listeners", [
    [],
    [pb.Listener(name="INTERNAL", host="", port=1)],
    [pb.Listener(name="INTERNAL", host="h", port=0)],
    [pb.Listener(name="INTERNAL", host="h", port=70000)],
    [pb.Listener(name="A", host="h", port=1), pb.Listener(name="A", host="h", port=2)],
])
def test_bad_registration_is_refused_and_stores_nothing(h, listeners):
    before = h.log.next_offset
    response = h.run(h.machine.register_broker, pb.RegisterBrokerRequest(
        broker_id=1, incarnation_id="x", listeners=listeners))
    assert response.error_code == pb.INVALID_REQUEST and response.error_message
    assert h.log.next_offset == before and 1 not in h.metadata.brokers


def test_new_incarnation_of_a_leader_loses_leadership_and_isr(h):
    three_brokers(h)
    h.create("t", partitions=3, rf=3)
    led = [p for p in h.metadata.all_partitions() if p.leader == 1]
    assert led
    # Its session expired, and the timer has not fenced it yet: the registration does.
    h.now_ms += h.config.broker_session_timeout_ms + 1
    assert h.register(1, incarnation="restarted").error_code == pb.NONE
    for p in led:
        now = h.partition(p.topic, p.partition)
        assert now.leader != 1 and 1 not in now.isr and now.leader_epoch == p.leader_epoch + 1


# ---------------------------------------------------------------- topics

def test_create_topic_spreads_replicas_and_leaders(h):
    three_brokers(h)
    result = h.create("orders", partitions=6, rf=2)
    assert (result.error_code, result.num_partitions, result.replication_factor) == (pb.NONE, 6, 2)
    parts = [h.partition("orders", i) for i in range(6)]
    assert {p.leader for p in parts} == {1, 2, 3}
    for p in parts:
        assert p.leader == p.replicas[0] and p.isr == p.replicas and len(set(p.replicas)) == 2
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
    assert h.metadata.topics["orders"].configs == {"min.insync.replicas": "1"}
    # single-partition topics get different leaders
    leaders = {h.create(f"s{i}").error_code == pb.NONE and h.partition(f"s{i}").leader
               for i in range(3)}
    assert leaders == {1, 2, 3}


def test_create_topic_defaults_and_configs(tmp_path):
    h = Harness(tmp_path, settings=["num.partitions=4", "default.replication.factor=2",
                                    "min.insync.replicas=2"])
    three_brokers(h)
    result = h.create("d", partitions=-1, rf=-1, configs={"retention.ms": "1000"})
    assert (result.num_partitions, result.replication_factor) == (4, 2)
    assert h.metadata.topics["d"].configs == {"min.insync.replicas": "2", "retention.ms": "1000"}
    h.log.close()


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "x" * 250, "sp ace", "ü"])
def test_create_topic_bad_name(h, name):
    three_brokers(h)
    result = h.create(name)
    assert result.error_code == pb.INVALID_TOPIC_EXCEPTION and result.error_message
    assert not h.metadata.topics


@pytest.mark.parametrize("partitions,rf,code", [
    (0, 1, pb.INVALID_PARTITIONS), (-2, 1, pb.INVALID_PARTITIONS),
    (10_001, 1, pb.INVALID_PARTITIONS),
    (1, 4, pb.INVALID_REPLICATION_FACTOR), (1, 0, pb.INVALID_REPLICATION_FACTOR),
    (1, -5, pb.INVALID_REPLICATION_FACTOR),
])
def test_create_topic_bad_counts(h, partitions, rf, code):
    three_brokers(h)
    assert h.create("t", partitions=partitions, rf=rf).error_code == code
    assert not h.metadata.topics


@pytest.mark.parametrize("configs", [
    {"no.such.config": "1"}, {"min.insync.replicas": "0"}, {"retention.ms": "soon"},
    {"message.timestamp.type": "Later"}, {"cleanup.policy": "compacted"},
    {"unclean.leader.election.enable": "yes"},
])
def test_create_topic_bad_config(h, configs):
    three_brokers(h)
    result = h.create("t", configs=configs)
    assert result.error_code == pb.INVALID_CONFIG and result.error_message
    assert not h.metadata.topics


@pytest.mark.parametrize("name,value", [
    ("segment.bytes", "3000000000"), ("retention.ms", "99999999999999999999"),
    ("max.message.bytes", str(1 << 31)), ("min.insync.replicas", str(1 << 31)),
    ("segment.bytes", "1_000_000"),
])
def test_create_topic_refuses_configs_no_broker_could_host(h, name, value):
    """Issue 14, bug 7: values a broker's LogConfig refuses were accepted here before."""
    three_brokers(h)
    offset = h.log.next_offset
    result = h.create("t", configs={name: value})
    assert result.error_code == pb.INVALID_CONFIG, result
    assert name in result.error_message and value in result.error_message
    assert not h.metadata.topics and h.log.next_offset == offset  # nothing written


def test_create_topic_exists_collides_or_repeats(h):
    three_brokers(h)
    assert h.create("a.b").error_code == pb.NONE
    assert h.create("a.b").error_code == pb.TOPIC_ALREADY_EXISTS
    assert h.create("a_b").error_code == pb.INVALID_TOPIC_EXCEPTION
    response = h.run(h.machine.create_topics, pb.CreateTopicsRequest(topics=[
        pb.CreatableTopic(name="x", num_partitions=1, replication_factor=1),
        pb.CreatableTopic(name="x", num_partitions=1, replication_factor=1),
        pb.CreatableTopic(name="y", num_partitions=1, replication_factor=1)]))
    assert [t.error_code for t in response.topics] == [pb.INVALID_REQUEST, pb.INVALID_REQUEST,
                                                       pb.NONE]
    assert set(h.metadata.topics) == {"a.b", "y"}


def test_rf_counts_only_live_brokers(h):
    three_brokers(h)
    h.advance(3500, 3)
    assert h.metadata.brokers[3].fenced
    assert h.create("t", rf=3).error_code == pb.INVALID_REPLICATION_FACTOR
    assert h.create("t", rf=2).error_code == pb.NONE
    assert 3 not in h.partition("t").replicas


def test_validate_only_creates_nothing(h):
    three_brokers(h)
    before = h.log.next_offset
    result = h.create("t", partitions=2, rf=2, validate_only=True)
    assert result.error_code == pb.NONE and result.num_partitions == 2
    assert not h.metadata.topics and h.log.next_offset == before


def test_delete_topic_sends_stop_replica_to_live_replicas(h):
    three_brokers(h)
    h.create("t", partitions=2, rf=2)
    h.advance(3500, 3)
    h.effects.clear()
    response = h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["t", "nope"]))
    assert [t.error_code for t in response.topics] == [pb.NONE, pb.UNKNOWN_TOPIC_OR_PARTITION]
    assert "t" not in h.metadata.topics
    stops = h.effects[-1].stop_replicas
    assert {b for b, _ in stops} <= {1, 2} and stops
    assert h.create("t").error_code == pb.NONE  # the name is free again


# ---------------------------------------------------------------- sessions and elections

def test_silent_broker_is_fenced_and_leadership_moves(h):
    three_brokers(h)
    h.create("t", partitions=3, rf=3)
    before = {p.partition: p for p in h.metadata.all_partitions()}
    assert h.advance(2900, 1) == []  # within the session
    fenced = h.advance(300, 1)
    assert fenced == [1] and h.metadata.brokers[1].fenced
    for number, old in before.items():
        p = h.partition("t", number)
        assert 1 not in p.isr and p.leader != 1
        assert p.partition_epoch == old.partition_epoch + 1
        assert p.leader_epoch == old.leader_epoch + (1 if old.leader == 1 else 0)
    assert sum(e.leader_elections for e in h.effects if 1 in e.fenced_brokers) == 1


def test_last_isr_member_lost_goes_offline_then_returns(h):
    three_brokers(h)
    h.create("t", rf=1)
    p = h.partition("t")
    h.advance(3500, p.leader)
    offline = h.partition("t")
    assert offline.leader == NO_LEADER and offline.isr == (p.leader,)
    assert offline.leader_epoch == 1
    # the same process heartbeats again: unfenced, leads again
    response = h.heartbeat(p.leader)
    assert response.error_code == pb.NONE and not response.is_fenced
    back = h.partition("t")
    assert back.leader == p.leader and back.leader_epoch == 2
    assert p.leader in h.effects[-1].resync_brokers


def test_unclean_election_when_enabled_per_topic(h):
    three_brokers(h)
    h.create("t", rf=2, configs={"unclean.leader.election.enable": "true"})
    p = h.partition("t")
    leader, follower = p.replicas
    h.alter(leader, p, [leader])  # the follower fell behind
    h.advance(3500, leader)
    q = h.partition("t")
    assert q.leader == follower and q.isr == (follower,)
    assert h.metadata.unclean_elections_total == 1
    assert h.describe().unclean_elections_total == 1


def test_controlled_shutdown_moves_leaders_then_allows_exit(h):
    three_brokers(h)
    h.create("t", partitions=3, rf=2)
    h.create("solo", rf=1)
    solo = h.partition("solo")
    shutting = solo.leader
    response = h.heartbeat(shutting, want_shutdown=True)
    assert response.error_code == pb.NONE and response.should_shutdown
    for p in h.metadata.all_partitions():
        assert p.leader != shutting
        if p.topic == "t":
            assert shutting not in p.isr and p.leader != NO_LEADER
    assert h.partition("solo").offline and h.partition("solo").isr == (shutting,)
    # while shutting down it is not elected back, even as preferred replica
    h.owner.run_now(h.machine.preferred_leader_check)
    assert all(p.leader != shutting for p in h.metadata.all_partitions())
    described = {b.broker_id: b for b in h.describe().brokers}
    assert described[shutting].in_controlled_shutdown


def test_fenced_broker_is_told_to_shut_down(h):
    three_brokers(h)
    h.advance(3500, 2)
    assert h.heartbeat(2, want_shutdown=True).should_shutdown


# ---------------------------------------------------------------- AlterPartition

def test_alter_partition_accepts_current_and_rejects_stale(h):
    three_brokers(h)
    h.create("t", rf=3)
    p = h.partition("t")
    leader = p.leader
    shrunk = [leader, p.replicas[1]]
    response = h.alter(leader, p, shrunk)
    assert response.error_code == pb.NONE
    item = response.items[0]
    assert item.error_code == pb.NONE and list(item.state.isr) == shrunk
    assert item.state.partition_epoch == p.partition_epoch + 1
    # the same proposal again carries a stale partition epoch
    stale = h.alter(leader, p, [leader]).items[0]
    assert stale.error_code == pb.INVALID_UPDATE_VERSION
    assert list(stale.state.isr) == shrunk  # the current state comes back
    # a zombie broker epoch is refused as a whole
    assert h.alter(leader, h.partition("t"), [leader], broker_epoch=1).error_code == \
        pb.STALE_BROKER_EPOCH
    unknown = h.run(h.machine.alter_partition, pb.AlterPartitionRequest(
        broker_id=leader, broker_epoch=h.epochs[leader], control_token=h.token(leader),
        items=[pb.AlterPartitionItem(topic="zz", partition=0, new_isr=[leader])]))
    assert unknown.items[0].error_code == pb.UNKNOWN_TOPIC_OR_PARTITION


def test_preferred_replica_back_in_isr_takes_leadership_at_once(h):
    three_brokers(h)
    h.create("t", rf=2)
    p = h.partition("t")
    preferred, other = p.replicas
    h.advance(3500, preferred)
    q = h.partition("t")
    assert q.leader == other and q.isr == (other,)
    h.heartbeat(preferred)  # back, but not in the ISR: stays follower
    h.owner.run_now(h.machine.preferred_leader_check)
    assert h.partition("t").leader == other
    response = h.alter(other, h.partition("t"), [other, preferred])
    assert response.items[0].error_code == pb.NONE
    assert response.items[0].state.leader == other  # the answer is the ISR change itself
    r = h.partition("t")
    assert r.leader == preferred and r.leader_epoch == q.leader_epoch + 1


def test_periodic_preferred_leader_check(h):
    three_brokers(h)
    h.create("t", rf=2)
    p = h.partition("t")
    preferred, other = p.replicas
    h.heartbeat(preferred, want_shutdown=True)
    assert h.partition("t").leader == other
    h.register(preferred, incarnation="again")  # restarted: new registration
    h.alter(other, h.partition("t"), [other, preferred])
    assert h.partition("t").leader == preferred


# ---------------------------------------------------------------- ReportCorruptReplica

def report_corrupt(h, broker_id, p, *, broker_epoch=None, token=None):
    return h.run(h.machine.report_corrupt_replica, pb.ReportCorruptReplicaRequest(
        broker_id=broker_id, control_token=h.token(broker_id) if token is None else token,
        broker_epoch=h.epochs[broker_id] if broker_epoch is None else broker_epoch,
        replicas=[pb.CorruptReplica(topic=p.topic, partition=p.partition,
                                    leader_epoch=p.leader_epoch,
                                    partition_epoch=p.partition_epoch, corrupt_offset=7)]))


def test_corrupt_leader_is_replaced_through_a_durable_record(h):
    three_brokers(h)
    h.create("t", rf=3)
    p = h.partition("t")
    h.effects.clear()
    response = report_corrupt(h, p.leader, p)
    [result] = response.results
    assert response.error_code == pb.NONE and result.error_code == pb.NONE
    new = h.partition("t")
    assert new.leader != p.leader and p.leader not in new.isr
    assert new.leader_epoch == p.leader_epoch + 1
    assert (result.state.leader, result.state.leader_epoch) == (new.leader, new.leader_epoch)
    # the brokers hear of it like of any change, and a restart replays it
    assert ("t", 0) in h.effects[-1].changed_partitions and h.effects[-1].leader_elections == 1
    h2 = h.restart()
    assert h2.partition("t") == new
    h2.log.close()


def test_corrupt_report_refusals_change_nothing(h):
    three_brokers(h)
    h.create("t", rf=3)
    h.create("other", rf=1)
    p = h.partition("t")
    offset = h.log.next_offset
    assert report_corrupt(h, p.leader, p, broker_epoch=1).error_code == pb.STALE_BROKER_EPOCH
    gone = p.__class__("nope", 0, p.replicas, p.isr, p.leader, 0, 0)
    assert report_corrupt(h, 1, gone).results[0].error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    other = h.partition("other")
    outsider = next(b for b in (1, 2, 3) if b not in other.replicas)
    result = report_corrupt(h, outsider, other).results[0]
    assert result.error_code == pb.NOT_LEADER_OR_FOLLOWER and result.error_message
    assert report_corrupt(h, other.leader, other).results[0].error_code == (
        pb.ELIGIBLE_LEADERS_NOT_AVAILABLE)
    assert h.log.next_offset == offset and h.partition("t") == p


# ---------------------------------------------------------------- durability

def test_restart_replays_to_the_same_state(h):
    three_brokers(h)
    h.create("a", partitions=3, rf=2)
    h.create("b", partitions=2, rf=3, configs={"retention.ms": "5"})
    h.advance(3500, 2)
    h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["a"]))
    h.create("c", partitions=1, rf=1)
    before = h.describe()
    h2 = h.restart()
    after = h2.describe()
    assert after.controller_epoch == before.controller_epoch + 1
    before.controller_epoch = after.controller_epoch
    assert after == before
    # brokers known unfenced get a fresh session and a resync
    assert h2.effects[0].resync_brokers == {1, 3}
    # epochs keep growing across restarts
    assert h2.register(4).broker_epoch > max(h.epochs.values())
    h2.log.close()


def test_restarted_controller_counts_known_sessions_from_its_start(h):
    """A broker that died just before (or right after) a controller took over, and so
    never heartbeated to it, is fenced one session timeout after the takeover (KRaft's
    BrokerHeartbeatManager.register on activation), not two."""
    three_brokers(h)
    h.create("t", rf=3)
    h.now_ms += 10_000  # the old controller was down a while: its timestamps are stale
    h2 = h.restart()
    h2.epochs = dict(h.epochs)
    timeout_ms = h2.config.broker_session_timeout_ms
    assert h2.advance(timeout_ms - 100, 1) == []  # a fresh session, from the takeover
    assert h2.advance(200, 1) == [1]  # one session timeout later: fenced
    assert h2.metadata.brokers[1].fenced and not h2.metadata.brokers[2].fenced
    h2.log.close()


def test_compaction_keeps_the_image_and_epochs_keep_growing(tmp_path):
    h = Harness(tmp_path / "ctl", settings=["unclean.leader.election.enable=true"])
    three_brokers(h)
    h.create("a", partitions=3, rf=2)
    h.create("b", partitions=2, rf=3)
    for _ in range(3):  # churn: fencing and returning brokers
        h.advance(3500, 2)
        h.heartbeat(2)
        h.advance(200)
    h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["a"]))
    h.advance(3500, 3)
    before = h.describe()
    count = h.log.record_count
    assert h.owner.maybe_compact(records_min=count + 1) is False  # below the threshold
    assert h.owner.maybe_compact(records_min=10)
    assert h.log.record_count < count / 2
    next_offset = h.log.next_offset
    h2 = h.restart()
    after = h2.describe()
    before.controller_epoch = after.controller_epoch
    assert after == before
    assert h2.metadata.topics_created_total == 2
    # a new registration still gets an epoch above every earlier one
    h2.end_session(2)
    assert h2.register(2, incarnation="again").broker_epoch > next_offset
    h3 = h2.restart()  # compacted log plus appended records replay too
    assert h3.metadata.brokers[2].broker_epoch == h2.epochs[2]
    h3.log.close()


def test_request_size_limits(h, monkeypatch):
    import tidewater.controller.state_machine as sm

    three_brokers(h)
    monkeypatch.setattr(sm, "PARTITIONS_MAX", 5)
    assert h.create("a", partitions=4).error_code == pb.NONE
    result = h.create("b", partitions=2)
    assert result.error_code == pb.INVALID_PARTITIONS and "5 partitions" in result.error_message
    monkeypatch.setattr(sm, "ITEMS_PER_REQUEST_MAX", 2)
    p = h.partition("a")
    items = [pb.AlterPartitionItem(topic="a", partition=0, leader_epoch=p.leader_epoch,
                                   partition_epoch=p.partition_epoch, new_isr=p.isr)] * 3
    response = h.run(h.machine.alter_partition, pb.AlterPartitionRequest(
        broker_id=p.leader, broker_epoch=h.epochs[p.leader], items=items,
        control_token=h.token(p.leader)))
    assert response.error_code == pb.INVALID_REQUEST
    deleted = h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["a", "x", "y"]))
    assert {t.error_code for t in deleted.topics} == {pb.INVALID_REQUEST}
    assert "a" in h.metadata.topics


def test_replica_fenced_during_delete_gets_stop_replica_when_back(h):
    three_brokers(h)
    topic_id = h.create("t", partitions=3, rf=3).topic_id
    assert len(topic_id) == 16
    h.advance(3500, 3)
    h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=["t"]))
    pending = {3: {("t", 0, topic_id), ("t", 1, topic_id), ("t", 2, topic_id)}}
    assert h.metadata.pending_stops == pending
    # survives a restart and a compaction
    epochs = h.epochs
    h = h.restart()
    h.epochs = epochs
    h.log.rewrite(h.metadata.snapshot_records())  # what compaction writes
    h = h.restart()
    h.epochs = epochs
    assert h.metadata.pending_stops == pending
    h.effects.clear()
    h.heartbeat(3)  # back: unfenced
    stops = [s for e in h.effects for s in e.stop_replicas]
    assert [(b, sorted((p.topic, p.partition) for p in ps)) for b, ps in stops] == \
        [(3, [("t", 0), ("t", 1), ("t", 2)])]
    assert all(p.leader_epoch == -1 for _, ps in stops for p in ps)
    # Only that incarnation's logs may be deleted by these StopReplicas.
    assert all(p.topic_id == topic_id for _, ps in stops for p in ps)
    assert h.metadata.pending_stops == {}
    h2 = h.restart()
    assert h2.metadata.pending_stops == {}
    h2.log.close()


def test_a_joiner_needs_the_broker_epoch_of_its_live_registration(h):
    """KIP-903, found by the simulation (seeds 542, 1129): a leader proposes a follower
    from the fetches of its previous process; by the time the proposal arrives the
    follower restarted (maybe without records it had) and registered again."""
    three_brokers(h)
    h.create("t", rf=2)
    p = h.partition("t")
    leader, follower = p.leader, next(r for r in p.replicas if r != p.leader)
    assert h.alter(leader, p, [leader]).items[0].error_code == pb.NONE  # shrink: no joiner
    q = h.partition("t")
    old_epoch = h.epochs[follower]
    h.end_session(follower)
    h.register(follower, incarnation="inc-2")  # a new process, a new broker epoch
    h.heartbeat(follower)
    assert h.epochs[follower] != old_epoch
    q = h.partition("t")
    for epochs in ([h.epochs[leader], old_epoch], [h.epochs[leader], -1], []):
        refused = h.alter(leader, q, [leader, follower], member_epochs=epochs)
        assert refused.items[0].error_code == pb.INELIGIBLE_REPLICA, epochs
        assert h.partition("t").isr == (leader,)
    lengths = h.alter(leader, q, [leader, follower], member_epochs=[h.epochs[follower]])
    assert lengths.items[0].error_code == pb.INVALID_REQUEST  # one epoch per member
    accepted = h.alter(leader, q, [leader, follower])  # the live registration's epoch
    assert accepted.items[0].error_code == pb.NONE
    assert h.partition("t").isr == (leader, follower)


def test_no_preferred_leader_move_on_isr_expansion_without_auto_rebalance(tmp_path):
    h = Harness(tmp_path, settings=["auto.leader.rebalance.enable=false"])
    three_brokers(h)
    h.create("t", rf=2)
    p = h.partition("t")
    preferred, other = p.replicas
    h.advance(3500, preferred)
    h.heartbeat(preferred)
    response = h.alter(other, h.partition("t"), [other, preferred])
    assert response.items[0].error_code == pb.NONE
    assert h.partition("t").leader == other  # the operator turned rebalancing off


# ---------------------------------------------------------------- CreatePartitions

def create_partitions(h, name, count, validate_only=False):
    response = h.run(h.machine.create_partitions, pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name=name, count=count)], validate_only=validate_only))
    return response.topics[0]


def test_create_partitions_adds_only_new_partitions_and_survives_a_restart(h):
    three_brokers(h)
    h.create("t", partitions=2, rf=2)
    before = {n: h.partition("t", n) for n in (0, 1)}
    assert create_partitions(h, "t", 5, validate_only=True).error_code == pb.NONE
    assert len(h.metadata.topics["t"].partitions) == 2
    grown = create_partitions(h, "t", 5)
    assert grown.error_code == pb.NONE and grown.num_partitions == 5
    assert grown.topic_id == h.metadata.topics["t"].topic_id
    info = h.metadata.topics["t"]
    assert sorted(info.partitions) == [0, 1, 2, 3, 4]
    assert all(h.partition("t", n) == before[n] for n in (0, 1))  # untouched
    for n in (2, 3, 4):
        p = h.partition("t", n)
        assert len(p.replicas) == 2 and p.leader in p.replicas and set(p.isr) == set(p.replicas)
        assert p.topic_id == info.topic_id
    # the brokers hear of the new partitions as new
    assert {("t", 2), ("t", 3), ("t", 4)} <= h.effects[-1].new_partitions
    h2 = h.restart()
    assert sorted(h2.metadata.topics["t"].partitions) == [0, 1, 2, 3, 4]
    assert h2.partition("t", 3) == h.partition("t", 3)
    h2.log.close()


def test_create_partitions_refusals_change_nothing(h):
    three_brokers(h)
    h.create("t", partitions=3, rf=3)
    offset = h.metadata.last_offset
    assert create_partitions(h, "nope", 4).error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert create_partitions(h, "t", 3).error_code == pb.INVALID_PARTITIONS
    assert create_partitions(h, "t", 2).error_code == pb.INVALID_PARTITIONS
    assert h.metadata.last_offset == offset
    h.advance(h.config.broker_session_timeout_ms + 500, 3)  # broker 3 fenced: 2 live
    offset = h.metadata.last_offset
    assert create_partitions(h, "t", 4).error_code == pb.INVALID_REPLICATION_FACTOR
    assert h.metadata.last_offset == offset and len(h.metadata.topics["t"].partitions) == 3


# ---------------------------------------------------------------- duplicate registration

def test_a_second_incarnation_of_a_live_broker_is_refused_and_changes_nothing(h):
    """Kafka's DUPLICATE_BROKER_REGISTRATION: while the registered incarnation holds its
    session, another incarnation ID gets no epoch, no token, and fences no one."""
    three_brokers(h)
    h.create("t", partitions=3, rf=3)
    before = h.describe()
    token, epoch, records = h.token(1), h.epochs[1], h.log.record_count
    h.advance(2900)  # everyone heartbeats: broker 1 is live
    records = h.log.record_count
    response = h.register(1, incarnation="impostor")
    assert response.error_code == pb.DUPLICATE_BROKER_REGISTRATION
    assert response.broker_epoch == -1 and response.control_token == b""
    assert "broker 1" in response.error_message
    assert h.log.record_count == records  # nothing appended
    assert h.token(1) == token and h.metadata.brokers[1].broker_epoch == epoch
    assert not h.metadata.brokers[1].fenced
    after = h.describe()
    assert [(p.name, list(p.partitions)) for p in after.topics] == \
        [(p.name, list(p.partitions)) for p in before.topics]
    assert h.heartbeat(1).error_code == pb.NONE  # the real broker keeps working


def test_the_registered_incarnation_may_register_again(h):
    """A retry (its answer was lost) or a register-again after STALE_BROKER_EPOCH."""
    first = h.register(1)
    again = h.register(1)
    assert again.error_code == pb.NONE and again.broker_epoch > first.broker_epoch


def test_a_new_incarnation_registers_once_the_old_session_ended(h):
    three_brokers(h)
    # Silent, but still within the session: refused.
    h.advance(2900, 1)
    assert h.register(1, incarnation="inc-2").error_code == pb.DUPLICATE_BROKER_REGISTRATION
    # Expired (not yet seen by the timer): taken.
    h.now_ms += 200
    assert h.register(1, incarnation="inc-2").error_code == pb.NONE
    assert h.metadata.brokers[1].incarnation_id == "inc-2"


def test_a_broker_that_finished_its_controlled_shutdown_may_restart_at_once(h):
    three_brokers(h)
    assert h.heartbeat(1, want_shutdown=True).should_shutdown
    assert h.register(1, incarnation="inc-2").error_code == pb.NONE


def test_a_fenced_broker_may_come_back_as_a_new_incarnation(h):
    three_brokers(h)
    h.end_session(2)
    assert h.metadata.brokers[2].fenced
    assert h.register(2, incarnation="inc-2").error_code == pb.NONE


def test_after_a_controller_restart_known_sessions_count_as_live(h):
    """The new controller gives every unfenced broker a fresh session: a duplicate is
    refused then too, until a session timeout passed without heartbeats."""
    three_brokers(h)
    h2 = h.restart()
    assert h2.register(1, incarnation="inc-2").error_code == pb.DUPLICATE_BROKER_REGISTRATION
    h2.now_ms += h2.config.broker_session_timeout_ms - 1
    assert h2.register(1, incarnation="inc-2").error_code == pb.DUPLICATE_BROKER_REGISTRATION
    h2.now_ms += 2
    assert h2.register(1, incarnation="inc-2").error_code == pb.NONE
    h2.log.close()


# ---------------------------------------------------------------- internal topics

@pytest.mark.parametrize("name", ["__consumer_offsets", "__transaction_state"])
def test_internal_topics_cannot_be_deleted(h, name):
    three_brokers(h)
    h.create("__consumer_offsets", partitions=2, rf=1)
    h.create("ordinary")
    records = h.log.record_count
    response = h.run(h.machine.delete_topics, pb.DeleteTopicsRequest(names=[name, "ordinary"]))
    internal, ordinary = response.topics
    assert (internal.name, internal.error_code) == (name, pb.INVALID_TOPIC_EXCEPTION)
    assert "internal topic" in internal.error_message
    assert ordinary.error_code == pb.NONE  # the rest of the request is carried out
    assert "__consumer_offsets" in h.metadata.topics and "ordinary" not in h.metadata.topics
    assert h.log.record_count == records + 1  # only the ordinary topic's deletion


def test_a_heartbeat_counts_from_its_arrival_even_while_its_command_waits(h):
    """Behind a slow commit the heartbeat's command waits in the owner's queue, and the
    session timer's check may run first: the arrival (note_heartbeat) already counts.
    One without the registration's epoch and control token does not."""
    three_brokers(h)
    timeout_ms = h.config.broker_session_timeout_ms
    assert h.advance(timeout_ms - 500, 1) == []

    def heartbeat_request(token):
        return pb.BrokerHeartbeatRequest(broker_id=1, broker_epoch=h.epochs[1], control_token=token)

    h.machine.note_heartbeat(heartbeat_request(b"forged"), None, h.now_ms)
    h.machine.note_heartbeat(heartbeat_request(h.token(1)), None, h.now_ms)
    assert h.advance(timeout_ms - 100, 1) == []  # 2 timeouts - 600 ms since its command
    assert h.advance(200, 1) == [1]
