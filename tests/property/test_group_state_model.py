"""Random interleavings of group requests, ticks and write outcomes against the pure
group state machine (broker/group/state.py), checking its invariants after every step:

- every request is answered at most once, and nothing is left unanswered once the
  writes are done and the group has settled (or its member is gone);
- the generation never goes down;
- a STABLE group has no member waiting for a join; a join waits only while the group
  prepares a rebalance; COMPLETING/STABLE groups have a leader among their members;
- committed offsets only ever come from writes that succeeded (the model replays the
  successful writes' records and must agree with the state's offsets).
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.group import records
from tidewater.broker.group.state import GroupCoordinatorState, GroupSettings, GroupState
from tidewater.proto import tidewater_pb2 as pb

CLIENTS = ["a", "b", "c"]
SESSION_MS = 3000

steps = st.lists(st.one_of(
    st.tuples(st.just("join"), st.sampled_from(CLIENTS), st.booleans()),
    st.tuples(st.just("sync"), st.sampled_from(CLIENTS), st.booleans()),
    st.tuples(st.just("heartbeat"), st.sampled_from(CLIENTS), st.booleans()),
    st.tuples(st.just("leave"), st.sampled_from(CLIENTS), st.booleans()),
    st.tuples(st.just("commit"), st.sampled_from(CLIENTS), st.integers(0, 100)),
    st.tuples(st.just("tick"), st.integers(1, 4000), st.booleans()),
    st.tuples(st.just("write"), st.sampled_from([pb.NONE, pb.NONE, pb.NOT_ENOUGH_REPLICAS]),
              st.booleans()),
), max_size=60)


class Model:
    def __init__(self):
        ids = itertools.count()
        self.state = GroupCoordinatorState(
            GroupSettings(min_session_timeout_ms=1000, initial_rebalance_delay_ms=500),
            new_member_id=lambda client: f"{client}-{next(ids)}")
        self.now = 0
        self.tokens = itertools.count()
        self.answered: dict[int, object] = {}
        self.asked: set[int] = set()
        self.member_of: dict[str, str] = {}  # client -> member id it believes it has
        self.generation_of: dict[str, int] = {}
        self.writes: list = []
        self.durable_offsets: dict[tuple[str, int], int] = {}
        self.last_generation = 0

    def token(self) -> int:
        t = next(self.tokens)
        self.asked.add(t)
        return t

    def take(self, ready) -> None:
        for token, answer in ready.replies:
            assert token not in self.answered, f"token {token} answered twice"
            self.answered[token] = answer
            client = getattr(self, "_client_of", {}).get(token)
            if client is not None and hasattr(answer, "generation_id"):
                if answer.member_id:
                    self.member_of[client] = answer.member_id
                if answer.error_code == pb.NONE:
                    self.generation_of[client] = answer.generation_id
        self.writes += ready.writes

    def step(self, kind, a, b) -> None:
        s = self.state
        self._client_of = getattr(self, "_client_of", {})
        if kind == "tick":
            self.now += a
            self.take(s.tick(self.now))
        elif kind == "write":
            if self.writes:
                write = self.writes.pop(0 if b else -1)
                if a == pb.NONE:
                    for r in write.records:
                        if isinstance(r, records.OffsetCommitRecord) and r.value is not None:
                            self.durable_offsets[(r.topic, r.partition)] = r.value.offset
                        if isinstance(r, records.OffsetCommitRecord) and r.value is None:
                            self.durable_offsets.pop((r.topic, r.partition), None)
                self.take(s.on_write_done(write.write_id, a, self.now))
        elif kind == "join":
            t = self.token()
            self._client_of[t] = a
            self.take(s.join_group(
                t, self.now, group_id="g", member_id=self.member_of.get(a, ""),
                group_instance_id=None, client_id=a, client_host="", protocol_type="consumer",
                protocols=[("range", a.encode())] if b else [("range", b"x"), ("rr", b"y")],
                session_timeout_ms=SESSION_MS, rebalance_timeout_ms=2 * SESSION_MS,
                require_known_member_id=True))
        elif kind == "sync":
            t = self.token()
            member = self.member_of.get(a, "")
            self.take(s.sync_group(
                t, self.now, group_id="g", generation_id=self.generation_of.get(a, -1),
                member_id=member, protocol_type=None, protocol_name=None,
                assignments={m: m.encode() for m in self.member_of.values()} if b else {}))
        elif kind == "heartbeat":
            s.heartbeat(self.now, group_id="g", generation_id=self.generation_of.get(a, -1),
                        member_id=self.member_of.get(a, ""))
        elif kind == "leave":
            _, ready = s.leave_group(self.now, group_id="g",
                                     member_ids=[self.member_of.get(a, "")])
            self.take(ready)
        elif kind == "commit":
            t = self.token()
            self.take(s.commit_offsets(
                t, self.now, group_id="g", generation_id=self.generation_of.get(a, -1),
                member_id=self.member_of.get(a, ""), offsets={("t", 0): (b, -1, "")}))

    def check(self) -> None:
        group = self.state.groups.get("g")
        if group is None:
            return
        assert group.generation >= self.last_generation
        self.last_generation = group.generation
        waiting = [m for m in group.members.values() if m.join_token is not None]
        if waiting:
            assert group.state == GroupState.PREPARING_REBALANCE
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            assert group.leader_id in group.members
        if group.state == GroupState.STABLE:
            assert all(m.sync_token is None for m in group.members.values())
        committed = {tp: c.offset for tp, c in group.offsets.items()}
        assert committed == self.durable_offsets


@settings(max_examples=300, deadline=None)
@given(steps)
def test_random_interleavings_keep_the_invariants(plan):
    model = Model()
    for kind, a, b in plan:
        model.step(kind, a, b)
        model.check()
    # Finish every write, then let time pass: every request gets its one answer.
    for _ in range(10):
        while model.writes:
            model.step("write", pb.NONE, True)
            model.check()
        model.step("tick", 4 * SESSION_MS, False)
        model.check()
    while model.writes:
        model.step("write", pb.NONE, True)
    unanswered = model.asked - set(model.answered)
    assert not unanswered, (unanswered, model.state.groups.get("g"))
