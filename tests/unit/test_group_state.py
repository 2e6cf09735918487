"""The classic group protocol's pure state machine (broker/group/state.py): events in,
answers and writes out, time passed in."""

from __future__ import annotations

import itertools
import struct

import pytest

from tidewater.broker.group import records
from tidewater.broker.group.state import (
    CodeAnswer,
    CommitAnswer,
    GroupCoordinatorState,
    GroupSettings,
    GroupState,
    OffsetDeleteAnswer,
    Ready,
    SyncAnswer,
)
from tidewater.proto import tidewater_pb2 as pb

SESSION_MS, REBALANCE_MS = 10_000, 30_000
PROTOCOLS = [("range", b"r-meta"), ("roundrobin", b"rr-meta")]


class Harness:
    """A coordinator state whose writes succeed (or fail) when ``complete_writes`` says."""

    def __init__(self, delay_ms: int = 0):
        ids = itertools.count(1)
        self.state = GroupCoordinatorState(
            GroupSettings(min_session_timeout_ms=1000, initial_rebalance_delay_ms=delay_ms),
            new_member_id=lambda client: f"{client}-{next(ids)}")
        self.answers: dict[str, object] = {}
        self.writes: list = []
        self.tokens = itertools.count()

    def take(self, ready: Ready) -> Ready:
        for token, answer in ready.replies:
            self.answers[token] = answer
        self.writes += ready.writes
        return ready

    def complete_writes(self, now_ms: int, code: int = pb.NONE) -> list:
        done, self.writes = self.writes, []
        for write in done:
            self.take(self.state.on_write_done(write.write_id, code, now_ms))
        return done

    def join(self, token: str, now_ms: int, member_id: str = "", client: str = "c",
             protocols=PROTOCOLS, group: str = "g", session_ms: int = SESSION_MS) -> Ready:
        return self.take(self.state.join_group(
            token, now_ms, group_id=group, member_id=member_id, group_instance_id=None,
            client_id=client, client_host="/127.0.0.1", protocol_type="consumer",
            protocols=protocols, session_timeout_ms=session_ms,
            rebalance_timeout_ms=REBALANCE_MS, require_known_member_id=True))

    def new_member(self, client: str, now_ms: int) -> str:
        """A first join (MEMBER_ID_REQUIRED) then the join with the id: the member's id."""
        self.join(f"{client}-first", now_ms, client=client)
        answer = self.answers.pop(f"{client}-first")
        assert answer.error_code == pb.MEMBER_ID_REQUIRED
        self.join(f"{client}-join", now_ms, member_id=answer.member_id, client=client)
        return answer.member_id

    def sync(self, token: str, now_ms: int, member_id: str, generation: int,
             assignments: dict[str, bytes] | None = None) -> Ready:
        return self.take(self.state.sync_group(
            token, now_ms, group_id="g", generation_id=generation, member_id=member_id,
            protocol_type=None, protocol_name=None, assignments=assignments or {}))

    def commit(self, token: str, now_ms: int, member_id: str, generation: int,
               offset: int = 5) -> Ready:
        return self.take(self.state.commit_offsets(
            token, now_ms, group_id="g", generation_id=generation, member_id=member_id,
            offsets={("t", 0): (offset, 3, "meta")}))


def stable_group(h: Harness, clients=("a", "b")) -> tuple[list[str], int]:
    """Members joined in one generation (after the initial delay) and synced at 1 ms."""
    assert h.state.settings.initial_rebalance_delay_ms == 1
    members = [h.new_member(c, 0) for c in clients]
    h.take(h.state.tick(1))
    answers = [h.answers.pop(f"{c}-join") for c in clients]
    generation = answers[0].generation_id
    leader = answers[0].leader_id
    h.sync("leader-sync", 1, leader, generation, {m: m.encode() for m in members})
    for m in members:
        if m != leader:
            h.sync(f"sync-{m}", 1, m, generation)
    h.complete_writes(2)
    return members, generation


def test_first_join_gets_a_member_id_and_must_join_again():
    h = Harness()
    h.join("j1", 0)
    answer = h.answers["j1"]
    assert answer.error_code == pb.MEMBER_ID_REQUIRED and answer.member_id == "c-1"
    assert h.state.groups["g"].members == {}
    h.join("j2", 0, member_id="c-1")
    joined = h.answers["j2"]
    assert joined.error_code == pb.NONE and joined.generation_id == 1
    assert joined.leader_id == "c-1" and joined.protocol_name == "range"
    assert joined.members == (("c-1", None, b"r-meta"),)


def test_an_unknown_member_id_is_refused():
    h = Harness()
    h.join("j", 0, member_id="nobody")
    assert h.answers["j"].error_code == pb.UNKNOWN_MEMBER_ID


def test_session_timeout_outside_the_bounds_is_refused():
    h = Harness()
    h.join("j", 0, session_ms=10)
    assert h.answers["j"].error_code == pb.INVALID_SESSION_TIMEOUT


def test_a_join_waits_for_every_member_and_the_leader_alone_gets_the_members():
    h = Harness()
    a = h.new_member("a", 0)
    assert h.answers.pop("a-join").generation_id == 1  # alone: completes at once
    b = h.new_member("b", 10)  # STABLE? no: COMPLETING -> rebalance, waits for a
    assert "b-join" not in h.answers
    assert h.state.groups["g"].state == GroupState.PREPARING_REBALANCE
    h.join("a-rejoin", 20, member_id=a, client="a")
    ja, jb = h.answers["a-rejoin"], h.answers["b-join"]
    assert ja.generation_id == jb.generation_id == 2
    assert ja.leader_id == a and {m for m, _, _ in ja.members} == {a, b}
    assert jb.members == ()


def test_sync_answers_after_the_leaders_assignment_is_written():
    h = Harness(delay_ms=1)
    members, generation = stable_group(h)
    assert h.state.groups["g"].state == GroupState.STABLE
    for m in members:
        key = "leader-sync" if m == members[0] else f"sync-{m}"
        assert h.answers[key] == SyncAnswer(pb.NONE, "consumer", "range", m.encode())


def test_a_failed_metadata_write_answers_an_error_and_rebalances():
    h = Harness()
    a = h.new_member("a", 0)
    gen = h.answers.pop("a-join").generation_id
    h.sync("s", 1, a, gen, {a: b"x"})
    assert "s" not in h.answers  # waits for the write
    [write] = h.writes
    assert isinstance(write.records[0], records.GroupMetadataRecord)
    assert write.records[0].value.members[0].assignment == b"x"
    h.complete_writes(2, pb.NOT_ENOUGH_REPLICAS)
    assert h.answers["s"].error_code == pb.COORDINATOR_NOT_AVAILABLE
    assert h.state.groups["g"].members[a].assignment == b""
    assert h.state.groups["g"].state == GroupState.PREPARING_REBALANCE


def test_sync_with_a_stale_generation_is_illegal():
    h = Harness(delay_ms=1)
    members, generation = stable_group(h)
    h.sync("old", 5, members[0], generation - 1)
    assert h.answers["old"].error_code == pb.ILLEGAL_GENERATION


def test_heartbeats_keep_a_member_and_silence_evicts_it():
    h = Harness(delay_ms=1)
    (a, b), generation = stable_group(h)
    for now in range(1000, SESSION_MS + 1000, 1000):  # a heartbeats, b is silent
        assert h.state.heartbeat(now, group_id="g", generation_id=generation,
                                 member_id=a) == pb.NONE
        h.take(h.state.tick(now))
    assert b in h.state.groups["g"].members  # silent for less than its session
    h.take(h.state.tick(SESSION_MS + 2))
    group = h.state.groups["g"]
    assert b not in group.members and a in group.members
    assert group.state == GroupState.PREPARING_REBALANCE
    now = SESSION_MS + 3
    assert h.state.heartbeat(now, group_id="g", generation_id=generation,
                             member_id=a) == pb.REBALANCE_IN_PROGRESS
    assert h.state.heartbeat(now, group_id="g", generation_id=generation,
                             member_id=b) == pb.UNKNOWN_MEMBER_ID


def test_a_member_that_does_not_rejoin_by_the_deadline_is_removed():
    h = Harness(delay_ms=1)
    (a, b), generation = stable_group(h)
    h.join("a-rejoin", 100, member_id=a, client="a", protocols=[("roundrobin", b"x")])
    assert "a-rejoin" not in h.answers  # waits for b
    for now in range(100, 100 + REBALANCE_MS, 1000):  # b keeps heartbeating, never rejoins
        h.state.heartbeat(now, group_id="g", generation_id=generation, member_id=b)
        h.take(h.state.tick(now))
    h.take(h.state.tick(100 + REBALANCE_MS))
    answer = h.answers["a-rejoin"]
    assert answer.error_code == pb.NONE and answer.generation_id == generation + 1
    assert set(h.state.groups["g"].members) == {a}
    assert answer.protocol_name == "roundrobin"


def test_leave_group_rebalances_and_the_last_leaving_empties_the_group():
    h = Harness(delay_ms=1)
    (a, b), generation = stable_group(h)
    codes, ready = h.state.leave_group(10, group_id="g", member_ids=[b, "ghost"])
    h.take(ready)
    assert codes == [pb.NONE, pb.UNKNOWN_MEMBER_ID]
    assert h.state.groups["g"].state == GroupState.PREPARING_REBALANCE
    codes, ready = h.state.leave_group(11, group_id="g", member_ids=[a])
    h.take(ready)
    group = h.state.groups["g"]
    assert group.state == GroupState.EMPTY and group.generation == generation + 1
    assert [type(r) for w in h.writes for r in w.records] == [records.GroupMetadataRecord]


def test_offset_commits_check_the_generation_and_apply_once_written():
    h = Harness(delay_ms=1)
    (a, b), generation = stable_group(h)
    h.commit("stale", 10, a, generation - 1)
    assert h.answers["stale"] == CommitAnswer({("t", 0): pb.ILLEGAL_GENERATION})
    h.commit("stranger", 10, "nobody", generation)
    assert h.answers["stranger"] == CommitAnswer({("t", 0): pb.UNKNOWN_MEMBER_ID})
    h.commit("ok", 10, a, generation, offset=42)
    assert "ok" not in h.answers
    assert h.state.fetch_offsets("g", [("t", 0)]) == {("t", 0): None}  # not yet durable
    [write] = h.complete_writes(11)
    assert write.records == (records.OffsetCommitRecord(
        "g", "t", 0, records.OffsetCommitValue(42, 3, "meta", 10)),)
    assert h.answers["ok"] == CommitAnswer({("t", 0): pb.NONE})
    assert h.state.fetch_offsets("g", None)[("t", 0)].offset == 42


def test_a_failed_commit_write_keeps_the_old_offset():
    h = Harness(delay_ms=1)
    (a, _), generation = stable_group(h)
    h.commit("first", 10, a, generation, offset=7)
    h.complete_writes(11)
    h.commit("second", 12, a, generation, offset=9)
    h.complete_writes(13, pb.NOT_LEADER_OR_FOLLOWER)
    assert h.answers["second"] == CommitAnswer({("t", 0): pb.NOT_COORDINATOR})
    assert h.state.fetch_offsets("g", None)[("t", 0)].offset == 7


def test_commits_during_completing_rebalance_are_refused():
    h = Harness()
    a = h.new_member("a", 0)
    gen = h.answers.pop("a-join").generation_id
    h.commit("c", 1, a, gen)
    assert h.answers["c"] == CommitAnswer({("t", 0): pb.REBALANCE_IN_PROGRESS})


def test_a_standalone_commit_creates_an_empty_group_and_delete_writes_tombstones():
    h = Harness()
    h.commit("c", 1, "", -1, offset=3)
    h.complete_writes(2)
    assert h.state.groups["g"].state == GroupState.EMPTY
    h.take(h.state.delete_group("d", 3, "g"))
    [write] = h.writes
    assert all(r.value is None for r in write.records)
    h.complete_writes(4)
    assert h.answers["d"] == CodeAnswer(pb.NONE)
    assert "g" not in h.state.groups
    h.take(h.state.delete_group("d2", 5, "g"))
    assert h.answers["d2"] == CodeAnswer(pb.GROUP_ID_NOT_FOUND)


def test_a_group_with_members_cannot_be_deleted():
    h = Harness(delay_ms=1)
    stable_group(h)
    h.take(h.state.delete_group("d", 3, "g"))
    assert h.answers["d"] == CodeAnswer(pb.NON_EMPTY_GROUP)


def test_the_initial_delay_gathers_members_into_one_generation():
    h = Harness(delay_ms=3000)
    a = h.new_member("a", 0)
    b = h.new_member("b", 1000)
    h.take(h.state.tick(2000))
    assert not any(k.endswith("-join") for k in h.answers)  # still delaying (extended)
    h.take(h.state.tick(4000))
    ja, jb = h.answers["a-join"], h.answers["b-join"]
    assert ja.generation_id == jb.generation_id == 1
    assert {m for m, _, _ in ja.members} == {a, b}


def test_a_loaded_state_replays_to_the_same_groups_and_offsets():
    h = Harness(delay_ms=1)
    (a, b), generation = stable_group(h)
    h.commit("c", 10, a, generation, offset=11)
    written = []
    for w in h.writes:
        written += w.records
    h.complete_writes(11)
    history = [r for r in _all_written(h)] + written
    loaded = GroupCoordinatorState()
    for r in history:
        loaded.replay(records.decode(records.encode_key(r), records.encode_value(r)), 100)
    group = loaded.groups["g"]
    assert group.state == GroupState.STABLE and group.generation == generation
    assert set(group.members) == {a, b}
    assert group.members[a].assignment == a.encode()
    assert loaded.fetch_offsets("g", None)[("t", 0)].offset == 11


def _all_written(h: Harness) -> list:
    """The group metadata record the state would write now (what the sync wrote)."""
    from tidewater.broker.group.state import _group_metadata_record
    return [_group_metadata_record(h.state.groups["g"], 0)]


@pytest.mark.parametrize("group_id,expected", [
    ("", 0), ("a", 97), ("console-consumer-12345", None), ("polygenelubricants", None)])
def test_java_string_hash(group_id, expected):
    from tidewater.broker.group.coordinator import java_string_hash, partition_for
    if expected is not None:
        assert java_string_hash(group_id) == expected
    assert 0 <= partition_for(group_id, 50) < 50


def test_java_string_hash_known_values():
    from tidewater.broker.group.coordinator import java_string_hash, partition_for
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)  # Integer.MIN_VALUE
    assert partition_for("polygenelubricants", 50) == 0
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # a surrogate pair, as Java sees it


def static_join(h: Harness, token: str, now_ms: int, instance: str, member_id: str = "",
                protocols=PROTOCOLS) -> Ready:
    return h.take(h.state.join_group(
        token, now_ms, group_id="g", member_id=member_id, group_instance_id=instance,
        client_id=instance, client_host="", protocol_type="consumer", protocols=protocols,
        session_timeout_ms=SESSION_MS, rebalance_timeout_ms=REBALANCE_MS,
        require_known_member_id=True))


def static_group(h: Harness) -> tuple[str, str, int]:
    static_join(h, "a", 0, "inst-a")  # no MEMBER_ID_REQUIRED for a static member
    static_join(h, "b", 0, "inst-b")
    h.take(h.state.tick(1))
    a, b = h.answers.pop("a"), h.answers.pop("b")
    assert a.error_code == b.error_code == pb.NONE
    h.sync("sa", 1, a.member_id, a.generation_id, {a.member_id: b"A", b.member_id: b"B"})
    h.sync("sb", 1, b.member_id, b.generation_id)
    h.complete_writes(2)
    return a.member_id, b.member_id, a.generation_id


def test_a_restarted_static_member_takes_over_without_a_rebalance():
    h = Harness(delay_ms=1)
    a, b, generation = static_group(h)
    static_join(h, "a2", 10, "inst-a")  # a restart: same instance, no member id
    assert "a2" not in h.answers  # the new id is written first
    [write] = h.complete_writes(11)
    group = h.state.groups["g"]
    answer = h.answers["a2"]
    assert answer.error_code == pb.NONE and answer.generation_id == generation
    new_a = answer.member_id
    assert new_a != a and group.state == GroupState.STABLE
    assert group.static_members == {"inst-a": new_a, "inst-b": b}
    assert [m.member_id for m in write.records[0].value.members if m.group_instance_id
            == "inst-a"] == [new_a]
    h.sync("s2", 12, new_a, generation)
    assert h.answers["s2"].assignment == b"A"  # the old assignment stays
    # The old incarnation is fenced everywhere.
    assert h.state.heartbeat(13, group_id="g", generation_id=generation, member_id=a,
                             group_instance_id="inst-a") == pb.FENCED_INSTANCE_ID
    h.take(h.state.commit_offsets("c", 13, group_id="g", generation_id=generation,
                                  member_id=a, group_instance_id="inst-a",
                                  offsets={("t", 0): (1, -1, "")}))
    assert h.answers["c"] == CommitAnswer({("t", 0): pb.FENCED_INSTANCE_ID})
    codes, _ = h.state.leave_group(14, group_id="g", member_ids=[a],
                                   group_instance_ids=["inst-a"])
    assert codes == [pb.FENCED_INSTANCE_ID]


def test_a_static_member_leaves_by_instance_id_and_expires_like_any_member():
    h = Harness(delay_ms=1)
    a, b, generation = static_group(h)
    codes, ready = h.state.leave_group(10, group_id="g", member_ids=[""],
                                       group_instance_ids=["inst-a"])
    h.take(ready)
    assert codes == [pb.NONE]
    group = h.state.groups["g"]
    assert a not in group.members and "inst-a" not in group.static_members
    h.take(h.state.tick(10 + SESSION_MS + REBALANCE_MS))  # b never rejoins nor heartbeats
    assert group.members == {} and group.static_members == {}


def test_a_loaded_group_remembers_its_static_members():
    h = Harness(delay_ms=1)
    a, b, generation = static_group(h)
    from tidewater.broker.group.state import _group_metadata_record
    record = _group_metadata_record(h.state.groups["g"], 5)
    loaded = GroupCoordinatorState()
    loaded.replay(records.decode(records.encode_key(record), records.encode_value(record)), 9)
    assert loaded.groups["g"].static_members == {"inst-a": a, "inst-b": b}


def expiring_harness() -> Harness:
    h = Harness(delay_ms=1)
    h.state.settings = GroupSettings(min_session_timeout_ms=1000, initial_rebalance_delay_ms=1,
                                     offsets_retention_ms=100_000,
                                     offsets_retention_check_interval_ms=1000)
    return h


def test_a_standalone_committers_offsets_expire_one_by_one_by_commit_time():
    h = expiring_harness()
    h.take(h.state.commit_offsets("c1", 0, group_id="g", generation_id=-1, member_id="",
                                  offsets={("t", 0): (5, -1, "")}))
    h.take(h.state.commit_offsets("c2", 50_000, group_id="g", generation_id=-1, member_id="",
                                  offsets={("t", 1): (6, -1, "")}))
    h.complete_writes(50_001)
    h.take(h.state.tick(60_000))  # the first check is scheduled
    h.take(h.state.tick(100_500))
    [write] = h.writes
    assert write.records == (records.OffsetCommitRecord("g", "t", 0, None),)
    h.complete_writes(100_600)
    assert h.state.fetch_offsets("g", None).keys() == {("t", 1)}
    h.take(h.state.tick(151_000))
    [write] = h.writes
    assert write.records[-1] == records.GroupMetadataRecord("g", None)
    h.complete_writes(151_100)
    assert "g" not in h.state.groups


def test_a_consumer_groups_offsets_expire_from_when_it_became_empty_not_before():
    h = expiring_harness()
    (a, b), generation = stable_group(h)
    h.commit("c", 10, a, generation, offset=9)
    h.complete_writes(11)
    h.take(h.state.tick(1000))
    for now in range(2000, 200_000, 1000):  # members heartbeat: offsets stay
        for m in (a, b):
            h.state.heartbeat(now, group_id="g", generation_id=generation, member_id=m)
        h.take(h.state.tick(now))
    assert h.writes == [] and h.state.fetch_offsets("g", None)[("t", 0)].offset == 9
    _, ready = h.state.leave_group(200_000, group_id="g", member_ids=[a, b])
    h.take(ready)
    h.complete_writes(200_001)  # the empty generation
    assert h.state.groups["g"].state == GroupState.EMPTY
    h.take(h.state.tick(250_000))
    assert h.writes == []
    h.take(h.state.tick(301_000))
    [write] = h.writes
    h.complete_writes(301_001, pb.NOT_ENOUGH_REPLICAS)  # a failed expiry changes nothing
    assert h.state.fetch_offsets("g", None)[("t", 0)].offset == 9
    h.take(h.state.tick(302_001))
    h.complete_writes(302_002)
    assert "g" not in h.state.groups


def subscription(topics: list[str]) -> bytes:
    """A ConsumerProtocolSubscription v1: version, topics, user data (null), owned (none)."""
    out = struct.pack(">hi", 1, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">ii", -1, 0)


def test_offset_delete_keeps_subscribed_topics_of_a_live_consumer_group():
    h = Harness(delay_ms=1)
    (a, b), generation = stable_group(h)
    group = h.state.groups["g"]
    h.take(h.state.commit_offsets("c", 5, group_id="g", generation_id=generation, member_id=a,
                                  offsets={("t", 0): (5, 3, ""), ("u", 0): (7, 3, "")}))
    h.complete_writes(6)
    # Subscriptions that do not parse: every topic counts as subscribed (Kafka's None).
    h.take(h.state.delete_offsets("d1", 7, "g", [("u", 0)]))
    assert h.answers["d1"] == OffsetDeleteAnswer(pb.NONE, {("u", 0): pb.GROUP_SUBSCRIBED_TO_TOPIC})
    for member in group.members.values():
        member.protocols = [(group.protocol_name, subscription(["t"]))]
    h.take(h.state.delete_offsets("d2", 8, "g", [("t", 0), ("u", 0), ("u", 1)]))
    assert "d2" not in h.answers  # the tombstone is written first
    assert ("u", 0) in group.offsets
    [write] = h.complete_writes(9)
    assert [(r.topic, r.partition, r.value) for r in write.records] == [("u", 0, None)]
    assert h.answers["d2"] == OffsetDeleteAnswer(pb.NONE, {
        ("t", 0): pb.GROUP_SUBSCRIBED_TO_TOPIC, ("u", 0): pb.NONE, ("u", 1): pb.NONE})
    assert set(group.offsets) == {("t", 0)} and h.state.groups["g"] is group


def test_offset_delete_of_an_empty_group_and_failures():
    h = Harness()
    h.take(h.state.delete_offsets("none", 1, "g", [("t", 0)]))
    assert h.answers["none"] == OffsetDeleteAnswer(pb.GROUP_ID_NOT_FOUND, {})
    h.commit("c", 1, "", -1, offset=3)
    h.complete_writes(2)
    h.take(h.state.delete_offsets("fail", 3, "g", [("t", 0)]))
    h.complete_writes(4, code=pb.NOT_LEADER_OR_FOLLOWER)
    assert h.answers["fail"] == OffsetDeleteAnswer(pb.NONE, {("t", 0): pb.NOT_COORDINATOR})
    assert ("t", 0) in h.state.groups["g"].offsets  # nothing changed without the write
    h.take(h.state.delete_offsets("d", 5, "g", [("t", 0)]))
    [write] = h.complete_writes(6)
    assert write.records[-1] == records.GroupMetadataRecord("g", None)  # the group goes too
    assert h.answers["d"] == OffsetDeleteAnswer(pb.NONE, {("t", 0): pb.NONE})
    assert "g" not in h.state.groups


def test_offset_delete_of_a_non_consumer_group_with_members_is_refused():
    h = Harness(delay_ms=1)
    stable_group(h)
    h.state.groups["g"].protocol_type = "connect"
    h.take(h.state.delete_offsets("d", 3, "g", [("t", 0)]))
    assert h.answers["d"] == OffsetDeleteAnswer(pb.NON_EMPTY_GROUP, {})


@pytest.mark.timeout(30)
def test_delete_groups_right_after_the_sessions_ended_needs_no_tick():
    """Static members do not leave when they close (KIP-345): librdkafka's 0081 closes
    them, waits one session timeout and deletes their group. Kafka's expiry timer fires at
    the session's end; here the DeleteGroups that arrives after it expires them first, so
    no tick has to come in between."""
    h = Harness(delay_ms=1)
    a, b, generation = static_group(h)
    for member in (a, b):  # the closing consumers' last commit/heartbeat, at 100 ms
        assert h.state.heartbeat(100, group_id="g", generation_id=generation,
                                 member_id=member) == pb.NONE
    # Still inside the sessions: refused, and nothing changes.
    h.take(h.state.delete_group("early", 100 + SESSION_MS - 1, "g"))
    assert h.answers["early"] == CodeAnswer(pb.NON_EMPTY_GROUP) and not h.writes
    assert set(h.state.groups["g"].members) == {a, b}
    # Once they ended: the members go, the group empties, then it is deleted.
    h.take(h.state.delete_group("d", 100 + SESSION_MS, "g"))
    assert "d" not in h.answers  # waits for its tombstones
    assert [[type(r) for r in w.records] for w in h.writes] == [
        [records.GroupMetadataRecord], [records.GroupMetadataRecord]]
    assert h.writes[1].records[0].value is None  # the tombstone after the empty group
    h.complete_writes(100 + SESSION_MS + 1)
    assert h.answers["d"] == CodeAnswer(pb.NONE)
    assert "g" not in h.state.groups


@pytest.mark.timeout(30)
def test_offset_delete_after_the_sessions_ended_sees_an_empty_group():
    h = Harness(delay_ms=1)
    a, b, generation = static_group(h)
    h.commit("c", 5, a, generation, offset=7)
    h.complete_writes(6)
    h.take(h.state.delete_offsets("od", 5 + SESSION_MS, "g", [("t", 0)]))
    h.complete_writes(6 + SESSION_MS)
    answer = h.answers["od"]
    assert answer.error_code == pb.NONE and answer.errors == {("t", 0): pb.NONE}
    assert "g" not in h.state.groups  # empty, without offsets: gone with them
