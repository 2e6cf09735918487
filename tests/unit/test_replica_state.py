"""ReplicaState driven by scripts, as etcd's raft tests are (``raft/testdata/*.txt``).

Each file in ``testdata/replica/`` is one scenario: a command line, ``----``, the
output it must produce, a blank line; lines starting with ``#`` between commands
are comments. The harness (``Harness``) plays the shell: it feeds one event to a
``ReplicaState`` over a fake ``LogView`` (offsets and a real in-memory
``LeaderEpochCache``) and carries out the ``Ready`` it returns on that log, as the
broker and the simulation do (assign the epoch, truncate, append fetched records).

Output of a command, in this order (only what is there):

* what a call returned or raised: ``answer: ...``, ``raises: ERROR_NAME: message``;
* the ``Ready``, one field per line (``persist``, ``fetch``, ``alter-partition``,
  ``completed``, ``hw-moved``, ``appended``, ``leadership-changed``, ``counter``,
  ``note``, ``alarm``, ``error``), or ``(empty ready)`` for an event that returned
  the empty ``Ready``;
* every line of the state (``state``, ``log``, ``leader``, ``followers``, ``alter``,
  ``waits``, ``cycle``) that the command changed; ``state`` prints them all.

Commands (time is the clock set by ``now`` unless a command takes ``now=``)::

    init broker=1 [hw=0] [min-isr=1] [lag=10000] [truncate-first=true]
         [send-last-epoch=true] [fetch-backoff=1000]    # a new ReplicaState of t-0
                                                         # (again: a new scenario)
    log [start=0] [leo=0] [epochs=0:0,2:5]               # set up the fake log
    now 1000
    state
    leader-and-isr leader=1 epoch=3 pe=5 replicas=1,2,3 isr=1,2,3
    stop-replica epoch=3
    storage-failure
    min-isr 3
    check-append acks=all|1|0
    append leo=10 [acks=1] [wait=7 required=10 timeout=1000]   # check_append, then append
    wait-deadline id=7
    withdraw id=7
    tick [now=2000]
    follower-fetch replica=2 epoch=3 offset=10 [last-epoch=-1] [isr-eligible=false]
                   [record=false]
    offset-for-leader-epoch epoch=3 requested=2          # the leader answers one
    consumer-fetch epoch=3 offset=5
    alter-answer id=1 error=NONE [isr=1,2 pe=6 [epoch=3] [leader=1]]
    alter-unsure id=1
    wants                                                # follower_wants, fetch_position
    offset-for-leader-epoch-answer epoch=3 [error=NONE] [answer=0:5]
    fetch-answer epoch=3 [offset=<LEO>] [error=NONE] [hw=0] [log-start=0]
                 [diverging=0:5] [records=2:8,3:10]      # batches epoch:next_offset
    fail-persist op=assign-epoch|truncate|truncate-fully|append-fetched
                                                         # the next such op fails: the
                                                         # shell stops there and reports it
                                                         # (on_persist_failure)
    append-failed                                        # a follower append failed
    append-fails [acks=all|1]                            # check_append passes, the log
                                                         # raises a storage error
    corrupt-batch offset=5                               # a read or the scrub found it

The harness also checks, after every command, what must hold whatever the
scenario: a leader's HW never goes backwards within a leadership nor past its
LEO; a wait is answered at most once, never after it was withdrawn, and only if
it was registered; no AlterPartition is emitted while the previous one is
unanswered (an answer, ``unsure``, or a newer controller state ends it). The
property tests at the end drive the same harness with random commands.

Rewrite the expectations (like etcd's ``-rewrite``)::

    REWRITE=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/unit/test_replica_state.py

then read every changed expectation before committing it: an expectation claims
that this output is right (by /work/shared/reference/replication.md and the
module docstrings of ``broker/replication/replica*.py``), it is not a recording.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.sim.generations import replica_class_for
from tidewater.broker.replication.leader_state import LeadershipState
from tidewater.broker.replication.ready import (
    AppendFetched,
    AssignEpoch,
    Follow,
    IncrementLogStartOffset,
    Ready,
    StopFetching,
    Truncate,
    TruncateFully,
)
from tidewater.broker.replication.replica import (
    ACKS_ALL_WAIT_MS_MAX,
    FollowerOptions,
    LeaderAndIsrState,
    ReplicaState,
)
from tidewater.broker.storage.epoch_cache import LeaderEpochCache
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import TidewaterError

TESTDATA = Path(__file__).parent / "testdata" / "replica"
REWRITE = os.environ.get("REWRITE", "") not in ("", "0")
TOPIC, PARTITION = "t", 0
_WAIT_FOR_LEADER_AND_ISR = (pb.FENCED_LEADER_EPOCH, pb.NOT_LEADER_OR_FOLLOWER,
                            pb.STALE_BROKER_EPOCH)


class ScriptError(Exception):
    """A script is malformed (unknown command, missing argument)."""


# ====================================================================== the fake log

class FakeLog:
    """A ``LogView`` of offsets only (no batches): what the core reads of a log, plus the
    changes a shell makes to it, with the real ``Log``'s effect on the epoch cache."""

    def __init__(self) -> None:
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.leader_epoch_cache = LeaderEpochCache(None)

    def append(self, epoch: int, next_offset: int) -> None:
        """Records of ``epoch`` from the LEO up to ``next_offset`` (a batch)."""
        if next_offset <= self.log_end_offset:
            raise ScriptError(f"append to {next_offset} at LEO {self.log_end_offset}")
        self.leader_epoch_cache.assign(epoch, self.log_end_offset)
        self.log_end_offset = next_offset

    def truncate_to(self, offset: int) -> None:
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
        elif offset < self.log_end_offset:
            self.log_end_offset = offset
        self.leader_epoch_cache.truncate_from_end(offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.log_start_offset = self.log_end_offset = offset
        self.leader_epoch_cache.clear()

    def maybe_increment_log_start_offset(self, offset: int) -> None:
        if offset > self.log_end_offset:
            raise ScriptError(f"log start {offset} past the LEO {self.log_end_offset}")
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            self.leader_epoch_cache.truncate_from_start(offset)

    def describe(self) -> str:
        epochs = ",".join(f"{e}:{s}" for e, s in self.leader_epoch_cache.entries()) or "-"
        return f"start={self.log_start_offset} leo={self.log_end_offset} epochs={epochs}"


# ====================================================================== printing

def _ids(ids) -> str:
    return ",".join(str(i) for i in ids) or "-"


def _code(code: int) -> str:
    return pb.ErrorCode.Name(code)


def format_ready(ready: Ready) -> list[str]:
    """One line per non-empty field, in the order the shell carries them out."""
    lines = []
    for op in ready.persist:
        if isinstance(op, AssignEpoch):
            lines.append(f"persist: assign-epoch {op.epoch} at {op.start_offset}")
        elif isinstance(op, Truncate):
            lines.append(f"persist: truncate to {op.offset}"
                         + (" (below the corrupt batch)" if op.below_corrupt_batch else ""))
        elif isinstance(op, TruncateFully):
            lines.append(f"persist: truncate-fully start at {op.start_offset}")
        elif isinstance(op, AppendFetched):
            lines.append("persist: append-fetched")
        elif isinstance(op, IncrementLogStartOffset):
            lines.append(f"persist: increment-log-start to {op.offset}")
        else:
            raise AssertionError(f"unknown persist {op!r}")
    if isinstance(ready.fetch, Follow):
        lines.append(f"fetch: follow leader={ready.fetch.leader_id} epoch={ready.fetch.leader_epoch}")
    elif isinstance(ready.fetch, StopFetching):
        lines.append("fetch: stop")
    if ready.report_corrupt is not None:
        c = ready.report_corrupt
        lines.append(f"report-corrupt: id={c.report_id} epoch={c.leader_epoch} "
                     f"pe={c.partition_epoch} offset={c.corrupt_offset}")
    if ready.alter_partition is not None:
        a = ready.alter_partition
        lines.append(f"alter-partition: id={a.alter_id} epoch={a.leader_epoch} "
                     f"pe={a.partition_epoch} isr={_ids(a.new_isr)}")
    for waiter_id, code in ready.completed:
        lines.append(f"completed: {waiter_id} {_code(code)}")
    if ready.high_watermark_moved:
        lines.append("hw-moved")
    if ready.appended:
        lines.append("appended")
    if ready.leadership_changed:
        lines.append("leadership-changed")
    lines.extend(f"counter: {c}" for c in ready.counters)
    lines.extend(f"note: {n}" for n in ready.notes)
    lines.extend(f"alarm: {a}" for a in ready.alarms)
    if ready.error != pb.NONE:
        lines.append(f"error: {_code(ready.error)}: {ready.error_message}")
    return lines or ["(empty ready)"]


def describe_state(r: ReplicaState) -> dict[str, str]:
    """The replica's state as lines keyed by their prefix (``None``-valued lines omitted)."""
    lines = {
        "state": (f"role={r.role} leader={r.leader_id} epoch={r.leader_epoch} "
                  f"pe={r.partition_epoch} replicas={_ids(r.replicas)} isr={_ids(r.isr)} "
                  f"hw={r.high_watermark} min-isr={r.min_insync_replicas}"),
        "log": r.log.describe(),
    }
    leader = r.leader
    if leader is not None:
        pending = leader.pending_isr
        pending_text = ("-" if pending is None else
                        f"{'expand' if pending.is_expansion else 'shrink'} to "
                        f"{_ids(pending.proposed_isr)}")
        lines["leader"] = (f"epoch={leader.leader_epoch} pe={leader.partition_epoch} "
                           f"isr={_ids(leader.isr)} maximal-isr={_ids(leader.maximal_isr)} "
                           f"hw={leader.high_watermark} leo={leader.log_end_offset} "
                           f"epoch-start={leader.epoch_start_offset} pending={pending_text}")
        lines["followers"] = " ".join(
            f"{f.replica_id}:leo={f.log_end_offset},caught-up={f.last_caught_up_ms},"
            f"last-fetch={f.last_fetch_leader_log_end_offset}@{f.last_fetch_time_ms}"
            for f in leader.followers.values()) or "-"
        lines["alter"] = (f"id={r._alter_id} in-flight={r._alter_in_flight} "
                          f"next-send={r._alter_next_send_ms} backoff={r._alter_backoff_ms}")
        if r._deadlines:
            required = {waiter_id: offset for offset, waiter_id in r._waits}
            lines["waits"] = " ".join(
                f"{w}:required={required.get(w)},deadline={d}"
                for w, d in sorted(r._deadlines.items()))
    if r.corrupt_from is not None:
        lines["corrupt"] = (f"from={r.corrupt_from} report-in-flight={r._report_in_flight} "
                            f"refused={r._report_refused}")
    cycle = r.follower
    if cycle is not None:
        lines["cycle"] = (f"leader={cycle.leader_id} epoch={cycle.leader_epoch} "
                          f"phase={cycle.phase} parked={cycle.parked} "
                          f"retry-at={cycle.retry_at_ms}")
    return lines


# ====================================================================== the harness

def _flag(value: str) -> bool:
    if value not in ("true", "false"):
        raise ScriptError(f"expected true or false, got {value!r}")
    return value == "true"


def _int_list(value: str) -> tuple[int, ...]:
    return tuple(int(x) for x in value.split(",")) if value not in ("", "-") else ()


def _pair(value: str) -> tuple[int, int]:
    epoch, offset = value.split(":")
    return int(epoch), int(offset)


def _error(value: str) -> int:
    try:
        return pb.ErrorCode.Value(value)
    except ValueError:
        raise ScriptError(f"unknown ErrorCode {value!r}") from None


@dataclass
class Args:
    command: str
    positional: list[str]
    named: dict[str, str]
    used: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, line: str) -> Args:
        command, *tokens = line.split()
        named, positional = {}, []
        for token in tokens:
            if "=" in token:
                key, value = token.split("=", 1)
                named[key] = value
            else:
                positional.append(token)
        return cls(command, positional, named)

    def get(self, key: str, default: str | None = None) -> str:
        self.used.add(key)
        if key in self.named:
            return self.named[key]
        if default is None:
            raise ScriptError(f"{self.command}: missing {key}=")
        return default

    def int(self, key: str, default: int | None = None) -> int:
        return int(self.get(key, None if default is None else str(default)))

    def has(self, key: str) -> bool:
        self.used.add(key)
        return key in self.named

    def check_all_used(self) -> None:
        unused = set(self.named) - self.used
        if unused:
            raise ScriptError(f"{self.command}: unknown arguments {sorted(unused)}")


class Harness:
    """Plays the shell around one ``ReplicaState`` and checks what must always hold."""

    def __init__(self) -> None:
        self.now_ms = 0
        self.log = FakeLog()
        self.replica: ReplicaState | None = None
        self._fetched: list[tuple[int, int]] = []  # the records an AppendFetched appends
        self._fail_persist: type | None = None  # the next persist op of this type fails
        # What the checks remember.
        self.live_waits: set[int] = set()
        self.withdrawn: set[int] = set()
        self.answers: dict[int, int] = {}  # waiter id -> the ErrorCode it was answered
        self.alter_outstanding: int | None = None  # the alter_id sent and not answered
        self.alter_waits_for_leader_and_isr = False  # answered "wait for LeaderAndIsr"
        self._leader_seen: tuple[object, int] | None = None  # (leadership, its HW)

    # ---------------------------------------------------------------- running

    def run(self, line: str) -> list[str]:
        args = Args.parse(line)
        handler = getattr(self, "cmd_" + args.command.replace("-", "_"), None)
        if handler is None:
            raise ScriptError(f"unknown command {args.command!r}")
        before = describe_state(self.replica) if self.replica is not None else {}
        out = handler(args)
        args.check_all_used()
        if self.replica is None:
            return out or ["ok"]
        self.check_invariants()
        if args.command == "state":
            return out
        after = describe_state(self.replica)
        out += [f"{key}: {text}" for key, text in after.items() if before.get(key) != text]
        out += [f"{key}: gone" for key in before if key not in after]
        return out or ["ok"]

    @property
    def r(self) -> ReplicaState:
        if self.replica is None:
            raise ScriptError("no replica: run init first")
        return self.replica

    def apply(self, ready: Ready) -> list[str]:
        """Carry out ``ready`` as a shell does, then check it; returns its lines."""
        failed = None
        for op in ready.persist:
            if self._fail_persist is not None and isinstance(op, self._fail_persist):
                self._fail_persist = None
                failed = op  # the shell stops at the first failure and reports it
                break
            if isinstance(op, AssignEpoch):
                self.log.leader_epoch_cache.assign(op.epoch, op.start_offset)
            elif isinstance(op, Truncate):
                self.log.truncate_to(op.offset)
            elif isinstance(op, TruncateFully):
                self.log.truncate_fully_and_start_at(op.start_offset)
            elif isinstance(op, AppendFetched):
                for epoch, next_offset in self._fetched:
                    if next_offset > self.log.log_end_offset:
                        self.log.append(epoch, next_offset)
            elif isinstance(op, IncrementLogStartOffset):
                assert op.offset <= self.r.high_watermark, (
                    f"log start {op.offset} past the HW {self.r.high_watermark}")
                self.log.maybe_increment_log_start_offset(op.offset)
        self._fetched = []
        for waiter_id, code in ready.completed:
            assert waiter_id not in self.withdrawn, f"withdrawn wait {waiter_id} answered"
            assert waiter_id not in self.answers, (
                f"wait {waiter_id} answered twice: {_code(self.answers[waiter_id])}, "
                f"then {_code(code)}")
            assert waiter_id in self.live_waits, f"unknown wait {waiter_id} answered"
            self.live_waits.discard(waiter_id)
            self.answers[waiter_id] = code
        if ready.alter_partition is not None:
            assert self.alter_outstanding is None, (
                f"AlterPartition {ready.alter_partition} emitted while "
                f"{self.alter_outstanding} is unanswered")
            self.alter_outstanding = ready.alter_partition.alter_id
        lines = format_ready(ready)
        if failed is not None:
            before = self._leadership()
            failure_ready = self.r.on_persist_failure(failed, self.now_ms)
            self._controller_state_changed(before)
            lines += [f"persist-failed: {format_ready(Ready(persist=(failed,)))[0][9:]}"]
            lines += ["  " + line for line in self.apply(failure_ready)]
        return lines

    def _leadership(self) -> tuple[object, int, int]:
        r = self.replica
        if r is None:
            return (None, -1, -1)
        return (r.leader, r.leader_epoch, r.partition_epoch)

    def _controller_state_changed(self, leadership_before: tuple[object, int, int]) -> None:
        """A newer controller state (or the end of the leadership) supersedes a proposal."""
        if self._leadership() != leadership_before:
            self.alter_outstanding = None

    def check_invariants(self) -> None:
        """What holds after every event, whatever the scenario (module docstring)."""
        r = self.r
        leader = r.leader
        if leader is None:
            self._leader_seen = None
            assert not r._deadlines, "waits outlive the leadership"
            return
        hw = leader.high_watermark
        assert hw <= self.log.log_end_offset, f"HW {hw} past the LEO {self.log.log_end_offset}"
        if self._leader_seen is not None and self._leader_seen[0] is leader:
            assert hw >= self._leader_seen[1], f"HW went back: {self._leader_seen[1]} -> {hw}"
        self._leader_seen = (leader, hw)
        assert r.local_broker_id in leader.isr and set(leader.isr) <= set(leader.replicas)

    # ---------------------------------------------------------------- set-up

    def cmd_init(self, a: Args) -> list[str]:
        options = FollowerOptions(fetch_backoff_ms=a.int("fetch-backoff", 1000))
        replica_class = replica_class_for(
            truncate_first=_flag(a.get("truncate-first", "true")),
            send_last_fetched_epoch=_flag(a.get("send-last-epoch", "true")))
        self.replica = replica_class(
            TOPIC, PARTITION, local_broker_id=a.int("broker"), log=self.log,
            high_watermark=a.int("hw", 0), min_insync_replicas=a.int("min-isr", 1),
            replica_lag_time_max_ms=a.int("lag", 10_000), follower_options=options)
        return []

    def cmd_log(self, a: Args) -> list[str]:
        if a.has("epochs"):
            entries = [_pair(e) for e in a.get("epochs").split(",") if e != "-"]
            self.log.leader_epoch_cache = LeaderEpochCache(None, entries)
        self.log.log_start_offset = a.int("start", self.log.log_start_offset)
        self.log.log_end_offset = a.int("leo", self.log.log_end_offset)
        return [] if self.replica is not None else [f"log: {self.log.describe()}"]

    def cmd_now(self, a: Args) -> list[str]:
        (value,) = a.positional
        self.now_ms = int(value)
        return []

    def cmd_state(self, a: Args) -> list[str]:
        return [f"{key}: {text}" for key, text in describe_state(self.r).items()]

    # ---------------------------------------------------------------- controller

    def cmd_leader_and_isr(self, a: Args) -> list[str]:
        state = LeaderAndIsrState(TOPIC, PARTITION, a.int("leader"), a.int("epoch"), a.int("pe"),
                               _int_list(a.get("replicas")), _int_list(a.get("isr")))
        before = self._leadership()
        ready = self.r.on_leader_and_isr(state, self.now_ms)
        self._controller_state_changed(before)
        if self.alter_waits_for_leader_and_isr and ready.error == 0:
            # Any LeaderAndIsr the replica takes (a resend too) ends a proposal the
            # controller answered "wait for LeaderAndIsr": it may be sent again.
            self.alter_outstanding = None
            self.alter_waits_for_leader_and_isr = False
        return self.apply(ready)

    def cmd_stop_replica(self, a: Args) -> list[str]:
        before = self._leadership()
        ready = self.r.on_stop_replica(a.int("epoch"), self.now_ms)
        self._controller_state_changed(before)
        return self.apply(ready)

    def cmd_storage_failure(self, a: Args) -> list[str]:
        before = self._leadership()
        ready = self.r.on_storage_failure(self.now_ms)
        self._controller_state_changed(before)
        return self.apply(ready)

    def cmd_min_isr(self, a: Args) -> list[str]:
        (value,) = a.positional
        return self.apply(self.r.set_min_insync_replicas(int(value), self.now_ms))

    # ---------------------------------------------------------------- produce

    def _check_append(self, acks: str) -> tuple[int | None, list[str]]:
        acks_value = {"all": -1, "1": 1, "0": 0}[acks]
        try:
            return self.r.check_append(acks_value), []
        except TidewaterError as e:
            return None, [f"raises: {e.error_name}: {e}"]

    def cmd_check_append(self, a: Args) -> list[str]:
        epoch, out = self._check_append(a.get("acks"))
        return out or [f"answer: stamp epoch {epoch}"]

    def cmd_append(self, a: Args) -> list[str]:
        waiter_id, leo = a.int("wait", -1), a.int("leo")
        required_offset, timeout_ms = a.int("required", leo), a.int("timeout", 30_000)
        epoch, out = self._check_append(a.get("acks", "all" if waiter_id >= 0 else "1"))
        if epoch is None:
            return out  # refused: nothing written, nothing waits
        self.log.append(epoch, leo)
        if waiter_id >= 0:
            assert waiter_id not in self.live_waits and waiter_id not in self.answers, (
                f"script reuses waiter id {waiter_id}")
            self.live_waits.add(waiter_id)
        ready = self.r.on_local_append(leo, self.now_ms, waiter_id=waiter_id,
                                       required_offset=required_offset, timeout_ms=timeout_ms)
        return self.apply(ready)

    def cmd_append_fails(self, a: Args) -> list[str]:
        epoch, out = self._check_append(a.get("acks", "1"))
        if epoch is None:
            return out
        before = self._leadership()
        ready = self.r.on_leader_append_failure(self.now_ms)
        self._controller_state_changed(before)
        return self.apply(ready)

    def cmd_append_failed(self, a: Args) -> list[str]:
        """The shell reports a follower append (AppendFetched) it could not carry out."""
        return self.apply(self.r.on_persist_failure(AppendFetched(), self.now_ms))

    def cmd_fail_persist(self, a: Args) -> list[str]:
        self._fail_persist = {"assign-epoch": AssignEpoch, "truncate": Truncate,
                              "truncate-fully": TruncateFully,
                              "append-fetched": AppendFetched,
                              "increment-log-start": IncrementLogStartOffset}[a.get("op")]
        return []

    def cmd_corrupt_batch(self, a: Args) -> list[str]:
        return self.apply(self.r.on_corrupt_batch(a.int("offset"), self.now_ms))

    def cmd_wait_deadline(self, a: Args) -> list[str]:
        return self.apply(self.r.on_wait_deadline(a.int("id"), self.now_ms))

    def cmd_withdraw(self, a: Args) -> list[str]:
        waiter_id = a.int("id")
        self.r.withdraw_wait(waiter_id)
        if waiter_id in self.live_waits:
            self.live_waits.discard(waiter_id)
            self.withdrawn.add(waiter_id)
        return []

    def cmd_tick(self, a: Args) -> list[str]:
        self.now_ms = a.int("now", self.now_ms)
        return self.apply(self.r.tick(self.now_ms))

    # ---------------------------------------------------------------- leader: replication

    def cmd_follower_fetch(self, a: Args) -> list[str]:
        try:
            diverging, ready = self.r.on_follower_fetch(
                a.int("replica"), a.int("epoch"), a.int("offset"), a.int("last-epoch", -1),
                self.now_ms, isr_eligible=_flag(a.get("isr-eligible", "true")),
                record=_flag(a.get("record", "true")), log_start_offset=a.int("log-start", -1))
        except TidewaterError as e:
            return [f"raises: {e.error_name}: {e}"]
        if diverging is not None:
            out = [f"answer: diverging epoch={diverging[0]} end-offset={diverging[1]}"]
        else:
            out = [f"answer: records from {a.get('offset')}, hw={self.r.high_watermark}"]
        return out + self.apply(ready)

    def cmd_offset_for_leader_epoch(self, a: Args) -> list[str]:
        try:
            epoch, end_offset = self.r.answer_offset_for_leader_epoch(a.int("epoch"),
                                                                      a.int("requested"))
        except TidewaterError as e:
            return [f"raises: {e.error_name}: {e}"]
        return [f"answer: epoch={epoch} end-offset={end_offset}"]

    def cmd_delete_records(self, a: Args) -> list[str]:
        """DeleteRecords on this replica: the core's check, then the shell's move."""
        try:
            start = self.r.check_delete_records(a.int("offset"))
        except TidewaterError as e:
            return [f"raises: {e.error_name}: {e}"]
        self.log.maybe_increment_log_start_offset(start)
        out = [f"answer: log-start={start}"]
        waiter_id = a.int("wait", -1)
        if waiter_id >= 0:  # the answer waits for the ISR's log starts
            self.live_waits.add(waiter_id)
            out += self.apply(self.r.watch_low_watermark(
                start, self.now_ms, waiter_id=waiter_id, timeout_ms=a.int("timeout", 30_000)))
            out.append(f"low-watermark: {self.r.low_watermark}")
        return out

    def cmd_consumer_fetch(self, a: Args) -> list[str]:
        try:
            hw = self.r.check_consumer_fetch(a.int("epoch"), a.int("offset"))
        except TidewaterError as e:
            return [f"raises: {e.error_name}: {e}"]
        return [f"answer: read below hw={hw}"]

    def cmd_alter_answer(self, a: Args) -> list[str]:
        alter_id, error = a.int("id"), _error(a.get("error"))
        state = None
        if a.has("isr"):
            r = self.r
            state = LeaderAndIsrState(TOPIC, PARTITION, a.int("leader", r.local_broker_id),
                                   a.int("epoch", r.leader_epoch), a.int("pe"),
                                   r.replicas, _int_list(a.get("isr")))
        if alter_id == self.alter_outstanding:
            if error in _WAIT_FOR_LEADER_AND_ISR:
                self.alter_waits_for_leader_and_isr = True
            else:
                self.alter_outstanding = None
        return self.apply(self.r.on_alter_partition_answer(alter_id, error, state, self.now_ms))

    def cmd_alter_unsure(self, a: Args) -> list[str]:
        alter_id = a.int("id")
        if alter_id == self.alter_outstanding:
            self.alter_outstanding = None
        return self.apply(self.r.on_alter_partition_unsure(alter_id, self.now_ms))

    # ---------------------------------------------------------------- follower

    def cmd_wants(self, a: Args) -> list[str]:
        wants = self.r.follower_wants(self.now_ms)
        if wants is None:
            return ["answer: nothing"]
        if wants == "truncating":
            asked = self.r.offset_for_leader_epoch_request()
            assert asked is not None and asked[0] == self.r.leader_epoch, asked
            return [f"answer: offset-for-leader-epoch requested={asked[1]}"]
        offset, last_epoch, start = self.r.fetch_position()
        return [f"answer: fetch offset={offset} last-epoch={last_epoch} log-start={start}"]

    def cmd_offset_for_leader_epoch_answer(self, a: Args) -> list[str]:
        ready = self.r.on_offset_for_leader_epoch_answer(
            a.int("epoch"), _error(a.get("error", "NONE")), _pair(a.get("answer", "-1:-1")),
            self.now_ms)
        return self.apply(ready)

    def cmd_fetch_answer(self, a: Args) -> list[str]:
        self._fetched = [_pair(b) for b in a.get("records", "").split(",") if b]
        diverging = _pair(a.get("diverging")) if a.has("diverging") else None
        ready = self.r.on_fetch_answer(
            a.int("epoch"), a.int("offset", self.log.log_end_offset),
            _error(a.get("error", "NONE")), high_watermark=a.int("hw", 0),
            leader_log_start_offset=a.int("log-start", 0), diverging_epoch=diverging,
            now_ms=self.now_ms)
        return self.apply(ready)


# ====================================================================== scripts

@dataclass
class Directive:
    line_number: int
    comments: list[str]  # the lines before it (comments, blank lines)
    command: str
    expected: list[str]


def parse_script(text: str, path: Path) -> tuple[list[Directive], list[str]]:
    """The directives of a script, and the lines after the last one."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    directives, pending, i = [], [], 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            pending.append(line)
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1] != "----":
            raise ScriptError(f"{path}:{i + 1}: {line!r} is not followed by ----")
        expected, j = [], i + 2
        while j < len(lines) and lines[j] != "":
            expected.append(lines[j])
            j += 1
        directives.append(Directive(i + 1, pending, line, expected))
        pending, i = [], j + 1  # past the blank line that ends the block
    return directives, pending


def format_script(directives: list[Directive], trailer: list[str]) -> str:
    out = []
    for d in directives:
        out += d.comments + [d.command, "----"] + d.expected + [""]
    out += trailer
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


SCRIPTS = sorted(TESTDATA.glob("*.txt"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script(path: Path):
    directives, trailer = parse_script(path.read_text(), path)
    harness = Harness()
    mismatches = []
    for d in directives:
        actual = harness.run(d.command)
        if actual != d.expected:
            mismatches.append(f"{path.name}:{d.line_number}: {d.command}\n  expected:\n    "
                              + "\n    ".join(d.expected) + "\n  got:\n    "
                              + "\n    ".join(actual))
            d.expected = actual
    if REWRITE:
        path.write_text(format_script(directives, trailer))
        return
    assert not mismatches, "\n".join(mismatches)


def test_scripts_exist():
    assert len(SCRIPTS) >= 10, f"no scripts in {TESTDATA}"


def test_script_format_round_trips(tmp_path):
    text = "# a comment\n\ninit broker=1\n----\nok\n\nnow 5\n----\nok\n"
    directives, trailer = parse_script(text, tmp_path / "x.txt")
    assert [d.command for d in directives] == ["init broker=1", "now 5"]
    assert format_script(directives, trailer) == text


def test_harness_catches_a_wait_answered_twice(monkeypatch):
    # The checks must be able to fail: a core that answers a wait again is caught.
    h = Harness()
    for line in ("init broker=1", "leader-and-isr leader=1 epoch=1 pe=1 replicas=1 isr=1",
                 "append leo=5 wait=1"):
        h.run(line)
    assert h.answers == {1: pb.NONE}
    with pytest.raises(AssertionError, match="answered twice"):
        h.apply(Ready(completed=((1, pb.NONE),)))


# ====================================================================== properties

@st.composite
def event_lines(draw) -> list[str]:
    """A random life of a replica of t-0 on broker 1 (replicas 1, 2, 3), as commands."""
    lines = [f"init broker=1 min-isr={draw(st.integers(1, 3))} lag=500"]
    leader_epoch, waiter_id, now = 0, 0, 0
    leo = 0
    for step in range(draw(st.integers(5, 60))):
        now += draw(st.sampled_from([0, 0, 10, 100, 400, 700]))
        lines.append(f"now {now}")
        kind = "lai" if step == 0 else draw(st.sampled_from(
            ["lai", "isr", "resend", "append", "append", "fetch", "fetch", "fetch", "tick",
             "answer", "unsure", "deadline", "withdraw", "min-isr", "stop", "append-fails",
             "fail-epoch"]))
        if kind in ("lai", "isr", "resend"):
            if kind == "lai":
                leader_epoch += 1
                leader = draw(st.sampled_from([1, 1, 1, 2, -1]))
            isr = draw(st.sets(st.sampled_from([1, 2, 3]), min_size=1))
            if leader >= 0:
                isr.add(leader)
            lines.append(f"leader-and-isr leader={leader} epoch={leader_epoch} "
                         f"pe={'same' if kind == 'resend' else 'next'} replicas=1,2,3 "
                         f"isr={_ids(sorted(isr))}")
        elif kind == "append":
            leo += draw(st.integers(1, 5))
            if draw(st.booleans()):
                waiter_id += 1
                lines.append(f"append leo={leo} wait={waiter_id} "
                             f"timeout={draw(st.sampled_from([0, 300, 1000, 10**9]))}")
            else:
                lines.append(f"append leo={leo} acks=1")
        elif kind == "fetch":
            lines.append(f"follower-fetch replica={draw(st.sampled_from([2, 3]))} "
                         f"epoch={leader_epoch} "
                         f"offset={draw(st.one_of(st.just(leo), st.integers(0, leo)))} "
                         f"isr-eligible={draw(st.sampled_from(['true', 'true', 'false']))}")
        elif kind == "tick":
            lines.append("tick")
        elif kind == "append-fails":
            lines.append("append-fails")
        elif kind == "fail-epoch":
            lines.append("fail-persist op=assign-epoch")  # the next leadership's epoch
        elif kind == "answer":
            error = draw(st.sampled_from(["NONE", "NONE", "INVALID_UPDATE_VERSION",
                                          "INVALID_REQUEST", "FENCED_LEADER_EPOCH",
                                          "INELIGIBLE_REPLICA"]))
            lines.append(f"alter-answer id=latest error={error}")
        elif kind == "unsure":
            lines.append("alter-unsure id=latest")
        elif kind == "deadline":
            lines.append(f"wait-deadline id={draw(st.integers(1, max(1, waiter_id)))}")
        elif kind == "withdraw":
            lines.append(f"withdraw id={draw(st.integers(1, max(1, waiter_id)))}")
        elif kind == "min-isr":
            lines.append(f"min-isr {draw(st.integers(1, 4))}")
        else:
            lines.append(f"stop-replica epoch={draw(st.sampled_from([-1, leader_epoch]))}")
    return lines


class PropertyHarness(Harness):
    """The harness with what a random script cannot know filled in from the core: the
    alter id in flight (``id=latest``) and a controller answer that is consistent with the
    proposal (NONE commits it; INVALID_UPDATE_VERSION returns a newer committed ISR)."""

    controller_partition_epoch = 0

    def run(self, line: str) -> list[str]:
        r = self.replica
        if line.startswith("leader-and-isr"):
            # The controller's partition epoch: bumped by every change it makes, whether
            # a LeaderAndIsr or an AlterPartition it commits ("same": a resend).
            if "pe=next" in line:
                self.controller_partition_epoch += 1
            line = re.sub(r"pe=(next|same)", f"pe={self.controller_partition_epoch}", line)
        if "id=latest" in line:
            if r is None:
                return ["ok"]
            line = line.replace("id=latest", f"id={r._alter_id}")
            if line.startswith("alter-answer") and r.leader is not None:
                proposal = r._alter_for
                error = Args.parse(line).named["error"]
                isr = (proposal.proposed_isr if error == "NONE" and proposal is not None
                       else r.leader.isr if error == "INVALID_UPDATE_VERSION" else None)
                if isr is not None:
                    self.controller_partition_epoch += 1
                    line += f" isr={_ids(isr)} pe={self.controller_partition_epoch}"
        if line.startswith("append") and r is not None and r.leader is None:
            return ["skipped: not the leader"]
        try:
            return super().run(line)
        except ScriptError:
            return ["skipped"]


def live_a_random_life(lines: list[str]) -> None:
    """The HW a leader exposes never goes backwards within a leadership; every wait is
    answered exactly once (completed, timed out or failed) unless withdrawn; no
    AlterPartition while one is unanswered. (Checked by the harness after every event.)"""
    h = PropertyHarness()
    for line in lines:
        h.run(line)
    # Past every deadline, every wait still live must be answered by a tick.
    h.now_ms += ACKS_ALL_WAIT_MS_MAX + 1
    h.run("tick")
    assert not h.live_waits, f"waits never answered: {sorted(h.live_waits)}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_lines())
def test_random_lives_keep_the_invariants(lines):
    live_a_random_life(lines)


def _waits_outlive_leadership(self, code, out):
    self._deadlines.clear()  # forgets the waits instead of failing them
    original_end_leadership(self, code, out)


def _hw_may_go_back(self, now_ms):
    # The HW follows the ISR's minimum down as well as up.
    before = self.high_watermark
    self.high_watermark = 0
    original_advance(self, now_ms)
    return self.high_watermark != before


def _sends_while_in_flight(self, now_ms, out):
    self._alter_in_flight = False
    original_send_alter(self, now_ms, out)


def _answers_twice(self, out):
    deadlines = dict(self._deadlines)
    original_complete_waits(self, out)
    self._deadlines.update((w, d) for w, d in deadlines.items() if w not in self._deadlines
                           and any(c == pb.NONE for x, c in out.completed if x == w))


original_end_leadership = ReplicaState._end_leadership
original_advance = LeadershipState.maybe_advance_high_watermark
original_send_alter = ReplicaState._maybe_send_alter
original_complete_waits = ReplicaState._complete_waits


@pytest.mark.parametrize("target, name, broken, caught_by", [
    (ReplicaState, "_end_leadership", _waits_outlive_leadership, "waits never answered"),
    (LeadershipState, "maybe_advance_high_watermark", _hw_may_go_back, "HW went back"),
    (ReplicaState, "_maybe_send_alter", _sends_while_in_flight, "emitted while"),
    (ReplicaState, "_complete_waits", _answers_twice, "answered twice"),
], ids=["waits-outlive-leadership", "hw-goes-back", "alter-while-in-flight", "answers-twice"])
def test_random_lives_catch_a_broken_core(monkeypatch, target, name, broken, caught_by):
    """The properties are not vacuous: each broken core above is caught, by its check."""
    monkeypatch.setattr(target, name, broken)
    # Derandomized: the same lives every run, so this cannot flake; a broken core is
    # caught within a few hundred lives (measured), the bound leaves room.
    check = settings(max_examples=1000, deadline=None, database=None, derandomize=True,
                     phases=[Phase.generate], suppress_health_check=list(HealthCheck))(
        given(event_lines())(live_a_random_life))
    with pytest.raises(AssertionError, match=caught_by):
        check()
