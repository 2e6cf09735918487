"""client/transactions.py's TransactionManager against a scripted coordinator: retried
codes back off and go again, a fence is fatal for every later call, a failed send makes
the transaction abortable, and the abort after it takes a new epoch (KIP-360)."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from tidewater.client.idempotence import IdempotentState
from tidewater.client.metadata import TopicPartition
from tidewater.client.transactions import (
    TransactionAbortRequiredError,
    TransactionManager,
    TransactionStateError,
    TxnState,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RequestTimedOutError,
    error_for_code,
)

pytestmark = pytest.mark.timeout(30)


class ScriptedCoordinator:
    """Answers each method from its queue of answers; records the requests."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.answers = {m: deque(a) for m, a in answers.items()}
        self.requests: list[tuple[str, Any]] = []
        self.forgotten = 0

    def call(self, method: str, request: Any) -> Any:
        self.requests.append((method, request))
        return self.answers[method].popleft()

    def _forget(self) -> None:
        self.forgotten += 1


def manager(answers: dict[str, list[Any]]) -> tuple[TransactionManager, ScriptedCoordinator]:
    tm = TransactionManager(None, IdempotentState(transactional=True),  # type: ignore[arg-type]
                            transactional_id="tx", transaction_timeout_ms=10_000,
                            request_timeout_ms=1000, retry_backoff_ms=1, max_block_ms=2000)
    coordinator = ScriptedCoordinator(answers)
    tm.coordinator = coordinator  # type: ignore[assignment]
    return tm, coordinator


def pid(code: int = pb.NONE, epoch: int = 0) -> pb.InitProducerIdResponse:
    return pb.InitProducerIdResponse(error_code=code, producer_id=7, producer_epoch=epoch)


def added(code: int) -> pb.AddPartitionsToTxnResponse:
    return pb.AddPartitionsToTxnResponse(partitions=[pb.TxnPartition(topic="t", error_code=code)])


def test_retried_codes_back_off_and_a_moved_coordinator_is_found_again():
    tm, c = manager({"InitProducerId": [pid(pb.COORDINATOR_LOAD_IN_PROGRESS),
                                        pid(pb.NOT_COORDINATOR), pid()],
                     "AddPartitionsToTxn": [added(pb.CONCURRENT_TRANSACTIONS), added(pb.NONE)],
                     "EndTxn": [pb.EndTxnResponse(error_code=pb.CONCURRENT_TRANSACTIONS),
                                pb.EndTxnResponse()]})
    tm.init()
    assert (tm.idempotence.producer_id, tm.idempotence.producer_epoch) == (7, 0)
    assert c.forgotten == 1
    tm.begin()
    tm.maybe_add_partition(TopicPartition("t", 0))
    tm.maybe_add_partition(TopicPartition("t", 0))  # once per transaction
    tm.end(committed=True)
    assert [m for m, _ in c.requests].count("AddPartitionsToTxn") == 2
    assert tm.state is TxnState.READY
    end = [r for m, r in c.requests if m == "EndTxn"][-1]
    assert end.committed and end.producer_id == 7 and end.transactional_id == "tx"


def test_a_fence_is_fatal_for_every_later_call():
    tm, _ = manager({"InitProducerId": [pid()],
                     "AddPartitionsToTxn": [added(pb.NONE)],
                     "EndTxn": [pb.EndTxnResponse(error_code=pb.PRODUCER_FENCED)]})
    tm.init()
    tm.begin()
    tm.maybe_add_partition(TopicPartition("t", 0))
    with pytest.raises(ProducerFencedError):
        tm.end(committed=True)
    for call in (tm.begin, tm.check_abort, lambda: tm.maybe_add_partition(TopicPartition("t", 1))):
        with pytest.raises(ProducerFencedError):
            call()


def test_a_failed_send_needs_an_abort_which_takes_a_new_epoch():
    tm, c = manager({"InitProducerId": [pid(), pid(epoch=1)],
                     "AddPartitionsToTxn": [added(pb.NONE)],
                     "EndTxn": [pb.EndTxnResponse()]})
    tm.init()
    tm.begin()
    tm.maybe_add_partition(TopicPartition("t", 0))
    tm.on_batch_failed(NotLeaderOrFollowerError("gone for good"))
    with pytest.raises(TransactionAbortRequiredError):
        tm.end(committed=True)
    with pytest.raises(TransactionAbortRequiredError):
        tm.maybe_add_partition(TopicPartition("t", 1))
    tm.end(committed=False)
    bump = [r for m, r in c.requests if m == "InitProducerId"][-1]
    assert (bump.producer_id, bump.producer_epoch) == (7, 0)  # KIP-360: the current ones
    assert tm.idempotence.producer_epoch == 1 and tm.state is TxnState.READY


def test_a_fenced_batch_is_fatal_and_calls_out_of_order_are_state_errors():
    tm, _ = manager({"InitProducerId": [pid()]})
    with pytest.raises(TransactionStateError):
        tm.begin()  # before init
    tm.init()
    with pytest.raises(TransactionStateError):
        tm.maybe_add_partition(TopicPartition("t", 0))  # before begin
    tm.begin()
    tm.on_batch_failed(ProducerFencedError("epoch bumped"))
    with pytest.raises(ProducerFencedError):
        tm.check_abort()


def test_a_transaction_with_nothing_added_ends_without_end_txn():
    tm, c = manager({"InitProducerId": [pid()]})
    tm.init()
    tm.begin()
    tm.end(committed=True)
    tm.begin()
    tm.end(committed=False)
    assert [m for m, _ in c.requests] == ["InitProducerId"]


def test_a_transactional_producer_never_bumps_its_epoch_locally():
    state = IdempotentState(transactional=True)
    state.set_producer_id(7, 3)

    class Batch:
        tp = TopicPartition("t", 0)
        producer_id = producer_epoch = base_sequence = -1
        record_count = 1
    batch = Batch()
    state.assign(batch)
    assert state.decide(batch, OutOfOrderSequenceError("gap")) == "fail"
    state.bump(batch.tp)
    assert state.partitions[batch.tp].epoch == 3


def test_a_refused_coordinator_lookup_is_fatal():
    tm, _ = manager({})

    class RefusingLookup:
        def call(self, method: str, request: Any) -> Any:
            raise error_for_code(pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "no ACL")

        def _forget(self) -> None:
            pass
    tm.coordinator = RefusingLookup()  # type: ignore[assignment]
    with pytest.raises(Exception) as raised:
        tm.init()
    assert getattr(raised.value, "error_code", None) == pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert tm.state is TxnState.FATAL_ERROR


def test_init_may_be_called_again_after_it_timed_out():
    tm, _ = manager({"InitProducerId": [pid(pb.COORDINATOR_LOAD_IN_PROGRESS)] * 10_000 + [pid()]})
    tm.max_block_ms = 50
    with pytest.raises(RequestTimedOutError):
        tm.init()
    assert tm.state is TxnState.UNINITIALIZED
    tm.coordinator = ScriptedCoordinator({"InitProducerId": [pid()]})  # type: ignore[assignment]
    tm.init()
    assert tm.state is TxnState.READY
