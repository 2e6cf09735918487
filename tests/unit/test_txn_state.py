"""The pure transaction coordinator: each rule as events in and the Ready they give."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.txn.state import (
    CodeAnswer,
    InitPidAnswer,
    MarkerJob,
    Ready,
    TransactionCoordinatorState,
    TxnSettings,
    TxnState,
)
from tidewater.proto import tidewater_pb2 as pb

pytestmark = pytest.mark.timeout(120)


class Harness:
    """Carries out each Ready as the shell does: writes go to ``log`` (or fail with
    ``fail_writes``), markers collect in ``markers`` until ``write_markers``."""

    def __init__(self, epoch: int = 5, max_timeout_ms: int = 60_000):
        self.state = TransactionCoordinatorState(epoch, TxnSettings(max_timeout_ms))
        self.log: list = []
        self.answers: dict[str, object] = {}
        self.markers: list[MarkerJob] = []
        self.fail_writes: pb.ErrorCode | None = None
        self.next_pid = 1000

    def run(self, ready: Ready, now_ms: int = 0) -> None:
        for token, answer in ready.replies:
            self.answers[token] = answer
        self.markers += ready.markers
        for write in ready.writes:
            code = self.fail_writes if self.fail_writes is not None else pb.NONE
            if code == pb.NONE:
                self.log.append(write.record)
            self.run(self.state.on_write_done(write.write_id, code, now_ms), now_ms)

    def init(self, txn: str, now_ms: int = 0, timeout_ms: int = 10_000, pid: int = -1,
             epoch: int = -1) -> object:
        self.next_pid += 1
        self.run(self.state.init_producer_id(
            "init", now_ms, transactional_id=txn, transaction_timeout_ms=timeout_ms,
            producer_id=pid, producer_epoch=epoch, fresh_producer_id=self.next_pid), now_ms)
        return self.answers.pop("init")

    def add(self, txn: str, pid: int, epoch: int, *partitions: tuple[str, int],
            now_ms: int = 0) -> pb.ErrorCode:
        self.run(self.state.add_partitions("add", now_ms, transactional_id=txn,
                                           producer_id=pid, producer_epoch=epoch,
                                           partitions=list(partitions)), now_ms)
        answer = self.answers.pop("add")
        assert isinstance(answer, CodeAnswer)
        return answer.error_code

    def end(self, txn: str, pid: int, epoch: int, committed: bool, now_ms: int = 0
            ) -> pb.ErrorCode:
        self.run(self.state.end_txn("end", now_ms, transactional_id=txn, producer_id=pid,
                                    producer_epoch=epoch, committed=committed), now_ms)
        answer = self.answers.pop("end")
        assert isinstance(answer, CodeAnswer)
        return answer.error_code

    def write_markers(self, now_ms: int = 0) -> list[MarkerJob]:
        jobs, self.markers = self.markers, []
        for job in jobs:
            self.run(self.state.on_markers_written(job, now_ms), now_ms)
        return jobs

    def status(self, txn: str) -> TxnState:
        md = self.state.describe(txn)
        assert md is not None
        return md.state


def test_a_new_transactional_id_gets_an_id_with_epoch_0_once_durable():
    h = Harness()
    assert h.init("tx") == InitPidAnswer(pb.NONE, 1001, 0)
    assert len(h.log) == 1 and h.log[0].value.status == TxnState.EMPTY


def test_an_answer_waits_for_its_write():
    state = TransactionCoordinatorState(0)
    ready = state.init_producer_id("t", 0, transactional_id="tx", transaction_timeout_ms=1000,
                                   producer_id=-1, producer_epoch=-1, fresh_producer_id=1)
    assert ready.replies == [] and len(ready.writes) == 1
    again = state.init_producer_id("u", 0, transactional_id="tx", transaction_timeout_ms=1000,
                                   producer_id=-1, producer_epoch=-1, fresh_producer_id=2)
    assert again.replies == [("u", InitPidAnswer(pb.CONCURRENT_TRANSACTIONS))]
    done = state.on_write_done(ready.writes[0].write_id, pb.NONE, 0)
    assert done.replies == [("t", InitPidAnswer(pb.NONE, 1, 0))]


def test_a_failed_write_changes_nothing_and_sends_the_client_to_find_the_coordinator():
    h = Harness()
    h.fail_writes = pb.NOT_LEADER_OR_FOLLOWER
    assert h.init("tx") == InitPidAnswer(pb.NOT_COORDINATOR)
    assert h.state.describe("tx") is None
    h.fail_writes = None
    assert h.init("tx") == InitPidAnswer(pb.NONE, 1002, 0)
    h.fail_writes = pb.NOT_ENOUGH_REPLICAS
    assert h.init("tx") == InitPidAnswer(pb.COORDINATOR_NOT_AVAILABLE)
    md = h.state.describe("tx")
    assert md is not None and md.current.producer_epoch == 0 and md.pending is None


def test_a_timeout_above_the_broker_maximum_is_refused():
    h = Harness(max_timeout_ms=1000)
    assert h.init("tx", timeout_ms=1001) == InitPidAnswer(pb.INVALID_TRANSACTION_TIMEOUT)
    assert h.init("tx", timeout_ms=0) == InitPidAnswer(pb.INVALID_TRANSACTION_TIMEOUT)


def test_commit_writes_prepare_then_markers_then_complete():
    h = Harness()
    h.init("tx")
    assert h.add("tx", 1001, 0, ("a", 0), ("b", 1)) == pb.NONE
    assert h.status("tx") == TxnState.ONGOING
    assert h.add("tx", 1001, 0, ("a", 0)) == pb.NONE  # already in: no write
    assert len(h.log) == 2
    assert h.end("tx", 1001, 0, True) == pb.NONE
    assert h.status("tx") == TxnState.PREPARE_COMMIT
    assert h.end("tx", 1001, 0, True) == pb.CONCURRENT_TRANSACTIONS
    assert h.end("tx", 1001, 0, False) == pb.INVALID_TXN_STATE
    assert h.add("tx", 1001, 0, ("c", 0)) == pb.CONCURRENT_TRANSACTIONS
    [job] = h.write_markers()
    assert job == MarkerJob("tx", 1001, 0, True, 5, frozenset({("a", 0), ("b", 1)}))
    assert h.status("tx") == TxnState.COMPLETE_COMMIT
    assert h.end("tx", 1001, 0, True) == pb.NONE  # a retry of the finished EndTxn
    assert h.end("tx", 1001, 0, False) == pb.INVALID_TXN_STATE
    assert [r.value.status for r in h.log] == [0, 1, 2, 4]
    assert h.log[-1].value.partitions == ()
    # the next transaction starts from CompleteCommit
    assert h.add("tx", 1001, 0, ("a", 0), now_ms=50) == pb.NONE
    md = h.state.describe("tx")
    assert md is not None and md.current.start_ms == 50


def test_end_txn_with_nothing_open_is_invalid_txn_state():
    h = Harness()
    h.init("tx")
    assert h.end("tx", 1001, 0, True) == pb.INVALID_TXN_STATE
    assert h.end("tx", 1001, 0, False) == pb.INVALID_TXN_STATE


def test_unknown_ids_and_wrong_producer_ids_are_invalid_mappings():
    h = Harness()
    assert h.add("nope", 1, 0, ("a", 0)) == pb.INVALID_PRODUCER_ID_MAPPING
    h.init("tx")
    assert h.add("tx", 999, 0, ("a", 0)) == pb.INVALID_PRODUCER_ID_MAPPING
    assert h.end("tx", 999, 0, True) == pb.INVALID_PRODUCER_ID_MAPPING


def test_a_second_producer_fences_the_first_and_aborts_its_transaction():
    h = Harness()
    h.init("tx")
    h.add("tx", 1001, 0, ("a", 0))
    assert h.init("tx") == InitPidAnswer(pb.CONCURRENT_TRANSACTIONS)
    assert h.status("tx") == TxnState.PREPARE_ABORT
    [job] = h.markers
    assert (job.committed, job.producer_epoch, job.partitions) == (False, 1,
                                                                  frozenset({("a", 0)}))
    # the zombie is fenced at once, before the abort completes
    assert h.add("tx", 1001, 0, ("b", 0)) == pb.PRODUCER_FENCED
    assert h.end("tx", 1001, 0, True) == pb.PRODUCER_FENCED
    assert h.init("tx") == InitPidAnswer(pb.CONCURRENT_TRANSACTIONS)  # retried: not yet
    h.write_markers()
    assert h.status("tx") == TxnState.COMPLETE_ABORT
    assert h.init("tx") == InitPidAnswer(pb.NONE, 1001, 2)
    assert h.end("tx", 1001, 1, False) == pb.PRODUCER_FENCED


def test_an_idle_producer_is_fenced_by_the_epoch_bump_alone():
    h = Harness()
    h.init("tx")
    assert h.init("tx") == InitPidAnswer(pb.NONE, 1001, 1)
    assert h.add("tx", 1001, 0, ("a", 0)) == pb.PRODUCER_FENCED


def test_a_transaction_past_its_timeout_is_aborted_with_an_epoch_bump():
    h = Harness()
    h.init("tx", timeout_ms=1000)
    h.add("tx", 1001, 0, ("a", 0), now_ms=100)
    h.run(h.state.tick(1099), 1099)
    assert h.status("tx") == TxnState.ONGOING and not h.markers
    h.run(h.state.tick(1100), 1100)
    assert h.status("tx") == TxnState.PREPARE_ABORT
    [job] = h.write_markers(1200)
    assert not job.committed and job.producer_epoch == 1
    assert h.status("tx") == TxnState.COMPLETE_ABORT
    assert h.end("tx", 1001, 0, True) == pb.PRODUCER_FENCED
    # KIP-360: the timed-out producer recovers with its own id and old epoch: the
    # coordinator's bump stands for its own (Kafka's lastProducerEpoch rule)
    assert h.init("tx", pid=1001, epoch=0) == InitPidAnswer(pb.NONE, 1001, 1)
    assert h.init("tx", pid=1001, epoch=7) == InitPidAnswer(pb.PRODUCER_FENCED)
    assert h.init("tx", pid=1001, epoch=1) == InitPidAnswer(pb.NONE, 1001, 2)


def test_kip_360_a_retried_bump_gets_the_current_epoch_without_a_write():
    h = Harness()
    h.init("tx")
    assert h.init("tx", pid=1001, epoch=0) == InitPidAnswer(pb.NONE, 1001, 1)
    writes = len(h.log)
    assert h.init("tx", pid=1001, epoch=0) == InitPidAnswer(pb.NONE, 1001, 1)
    assert len(h.log) == writes
    assert h.init("tx", pid=77, epoch=0) == InitPidAnswer(pb.PRODUCER_FENCED)


def test_an_exhausted_epoch_rotates_to_a_new_producer_id():
    h = Harness()
    h.init("tx")
    md = h.state.describe("tx")
    assert md is not None
    from dataclasses import replace
    md.current = replace(md.current, producer_epoch=32766)
    answer = h.init("tx")
    assert isinstance(answer, InitPidAnswer) and answer.producer_epoch == 0
    assert answer.producer_id not in (-1, 1001)
    assert h.log[-1].value.previous_producer_id == 1001


def test_a_new_leader_finishes_what_the_old_one_prepared():
    h = Harness()
    for txn in ("c", "a", "o"):
        h.init(txn)
    pids = {t: h.state.describe(t).current.producer_id for t in ("c", "a", "o")}
    for txn in ("c", "a", "o"):
        h.add(txn, pids[txn], 0, ("t", 0))
    h.end("c", pids["c"], 0, True)
    h.end("a", pids["a"], 0, False)
    # the old coordinator dies before writing any marker
    fresh = TransactionCoordinatorState(6)
    for record in h.log:
        fresh.replay(record)
    ready = fresh.end_load(0)
    assert {(j.transactional_id, j.committed, j.coordinator_epoch) for j in ready.markers} == {
        ("c", True, 6), ("a", False, 6)}
    assert fresh.describe("o").state == TxnState.ONGOING
    for job in ready.markers:
        done = fresh.on_markers_written(job, 1)
        assert len(done.writes) == 1
        fresh.on_write_done(done.writes[0].write_id, pb.NONE, 1)
    assert fresh.describe("c").state == TxnState.COMPLETE_COMMIT
    assert fresh.describe("a").state == TxnState.COMPLETE_ABORT


def test_a_failed_complete_write_is_written_again_by_tick():
    h = Harness()
    h.init("tx")
    h.add("tx", 1001, 0, ("a", 0))
    h.end("tx", 1001, 0, False)
    h.fail_writes = pb.REQUEST_TIMED_OUT
    h.write_markers()
    assert h.status("tx") == TxnState.PREPARE_ABORT
    h.fail_writes = None
    h.run(h.state.tick(1), 1)
    assert h.status("tx") == TxnState.COMPLETE_ABORT


def test_an_idle_id_expires_with_a_tombstone_and_starts_over():
    h = Harness()
    h.state.settings = TxnSettings(60_000, transactional_id_expiration_ms=5000)
    h.init("tx", now_ms=0)
    h.add("tx", 1001, 0, ("a", 0), now_ms=10)
    h.run(h.state.tick(20_000), 20_000)  # Ongoing past its timeout: aborted, not expired
    h.write_markers(20_000)
    h.run(h.state.tick(24_999), 24_999)
    assert h.status("tx") == TxnState.COMPLETE_ABORT
    h.fail_writes = pb.REQUEST_TIMED_OUT
    h.run(h.state.tick(25_000), 25_000)
    assert h.status("tx") == TxnState.COMPLETE_ABORT  # the tombstone failed: kept
    h.fail_writes = None
    h.run(h.state.tick(25_001), 25_001)
    assert h.state.describe("tx") is None and h.log[-1].value is None
    replayed = TransactionCoordinatorState(0)
    for record in h.log:
        replayed.replay(record)
    assert replayed.txns == {}
    assert h.init("tx", now_ms=30_000) == InitPidAnswer(pb.NONE, h.next_pid, 0)


def test_abandon_answers_every_waiting_request_not_coordinator():
    state = TransactionCoordinatorState(0)
    state.init_producer_id("t", 0, transactional_id="tx", transaction_timeout_ms=1000,
                           producer_id=-1, producer_epoch=-1, fresh_producer_id=1)
    assert state.abandon().replies == [("t", InitPidAnswer(pb.NOT_COORDINATOR))]


# ---------------------------------------------------------------- properties

OPS = st.lists(st.tuples(
    st.sampled_from(["init", "add", "commit", "abort", "tick", "markers", "fail", "zombie"]),
    st.sampled_from(["x", "y"]), st.integers(0, 3)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_replaying_the_log_gives_the_state_and_epochs_never_go_back(ops):
    h = Harness()
    now = 0
    seen_epochs: dict[str, tuple[int, int]] = {}
    for op, txn, n in ops:
        now += 400
        md = h.state.describe(txn)
        pid, epoch = (md.current.producer_id, md.current.producer_epoch) if md else (1, 0)
        if op == "zombie":
            epoch -= 1
        h.fail_writes = pb.REQUEST_TIMED_OUT if op == "fail" else None
        if op in ("init", "fail"):
            h.init(txn, now, timeout_ms=1000)
        elif op in ("add", "zombie"):
            code = h.add(txn, pid, epoch, ("t", n), now_ms=now)
            if op == "zombie" and md is not None:
                assert code in (pb.PRODUCER_FENCED, pb.INVALID_PRODUCER_ID_MAPPING)
        elif op in ("commit", "abort"):
            h.end(txn, pid, epoch, op == "commit", now)
        elif op == "tick":
            h.run(h.state.tick(now), now)
        else:
            for job in h.write_markers(now):
                assert job.partitions  # markers only for transactions that touched some
        for t, md in h.state.txns.items():
            key = (md.current.producer_id, md.current.producer_epoch)
            if t in seen_epochs and seen_epochs[t][0] == key[0]:
                assert key[1] >= seen_epochs[t][1]
            seen_epochs[t] = key
            if md.state == TxnState.ONGOING:
                assert md.current.partitions and md.current.start_ms >= 0
            if md.state in (TxnState.EMPTY, TxnState.COMPLETE_ABORT, TxnState.COMPLETE_COMMIT):
                assert not md.current.partitions
    replayed = TransactionCoordinatorState(0)
    for record in h.log:
        replayed.replay(record)
    live = {t: md for t, md in h.state.txns.items() if md.current.producer_epoch >= 0}
    assert replayed.txns.keys() == live.keys()
    for t, md in live.items():
        from dataclasses import replace
        assert replayed.txns[t].current == replace(md.current, last_producer_epoch=-1)
