"""The chaos EOS app's recovery (tools/chaos/txn_workload.py) against fake confluent-kafka
clients, no cluster: a ``send_offsets_to_transaction`` that never returns (librdkafka
2.10+ once its cached group coordinator is decommissioned, confluentinc/librdkafka#5511),
an abort the coordinator refuses for good (EndTxn INVALID_TXN_STATE, fatal in
librdkafka), and a rewind answered UNSTABLE_OFFSET_COMMIT or failed whole with
NOT_COORDINATOR."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import confluent_kafka
import pytest

from tidewater.tools.chaos import txn_workload
from tidewater.tools.chaos.txn_workload import TxnWorkload

pytestmark = pytest.mark.timeout(60)
SOURCE, SINK = "in", "out"


class FakeProducer:
    def __init__(self, send_offsets=None, abort_error: confluent_kafka.KafkaError | None = None):
        self.send_offsets = send_offsets  # called instead of sending; None: succeeds
        self.abort_error = abort_error
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, value: bytes) -> None:
        self.calls.append(f"produce {topic}")

    def send_offsets_to_transaction(self, offsets, group, timeout: float) -> None:
        self.calls.append("send_offsets")
        if self.send_offsets is not None:
            self.send_offsets()

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        if self.abort_error is not None:
            raise confluent_kafka.KafkaException(self.abort_error)

    def flush(self, timeout: float) -> int:
        self.calls.append("flush")
        if self.abort_error is not None and self.abort_error.fatal():
            raise confluent_kafka.KafkaException(self.abort_error)  # as librdkafka's
        return 0


class FakeConsumer:
    def __init__(self, answers: list[list[SimpleNamespace] | confluent_kafka.KafkaError]):
        self.answers = answers  # what committed() answers (or raises), one per call
        self.seeks: list[tuple[int, int]] = []

    def assignment(self) -> list[confluent_kafka.TopicPartition]:
        return [confluent_kafka.TopicPartition(SOURCE, 0)]

    def committed(self, partitions, timeout: float) -> list[SimpleNamespace]:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, confluent_kafka.KafkaError):
            raise confluent_kafka.KafkaException(answer)
        return answer

    def seek(self, tp: confluent_kafka.TopicPartition) -> None:
        self.seeks.append((tp.partition, tp.offset))

    def consumer_group_metadata(self) -> object:
        return object()


def committed(offset: int, error: confluent_kafka.KafkaError | None = None) -> SimpleNamespace:
    return SimpleNamespace(topic=SOURCE, partition=0, offset=offset, error=error)


def record(offset: int) -> SimpleNamespace:
    return SimpleNamespace(topic=lambda: SOURCE, partition=lambda: 0, offset=lambda: offset,
                           value=lambda: f"v{offset}".encode())


def workload(monkeypatch) -> tuple[TxnWorkload, list[FakeProducer]]:
    app = TxnWorkload("127.0.0.1:1", SOURCE, SINK, run_id="r", rate_per_s=1.0)
    made: list[FakeProducer] = []

    def new_producer() -> FakeProducer:
        made.append(FakeProducer())
        return made[-1]
    monkeypatch.setattr(app, "_new_producer", new_producer)
    return app, made


def test_a_send_offsets_call_stuck_past_its_timeout_gets_a_new_producer(monkeypatch):
    monkeypatch.setattr(txn_workload, "CLIENT_CALL_TIMEOUT_S", 0.05)
    monkeypatch.setattr(txn_workload, "STUCK_CALL_GRACE_S", 0.05)
    app, made = workload(monkeypatch)
    released = threading.Event()
    stuck = FakeProducer(send_offsets=released.wait)  # blocks until the test ends
    consumer = FakeConsumer([[committed(7)]])
    try:
        after = app._transact(stuck, consumer, [record(7), record(8)])  # type: ignore[arg-type]
    finally:
        released.set()
    assert after is made[0] and app.producers_created == 0  # the fake made it
    assert "flush" not in stuck.calls  # left to the blocked call
    assert app.errors == {"app: StuckCallError": 1} and app.transactions_aborted == 1
    assert consumer.seeks == [(0, 7)] and app.transactions_committed == 0


def test_an_abort_refused_for_good_gets_a_new_producer(monkeypatch):
    app, made = workload(monkeypatch)
    abortable = confluent_kafka.KafkaError(confluent_kafka.KafkaError.CONCURRENT_TRANSACTIONS,
                                           "concurrent", txn_requires_abort=True)
    fatal = confluent_kafka.KafkaError(confluent_kafka.KafkaError.INVALID_TXN_STATE,
                                       "Failed to end transaction", fatal=True)

    def refuse() -> None:
        raise confluent_kafka.KafkaException(abortable)
    old = FakeProducer(send_offsets=refuse, abort_error=fatal)
    consumer = FakeConsumer([[committed(3)]])
    after = app._transact(old, consumer, [record(3)])  # type: ignore[arg-type]
    assert after is made[0]
    assert old.calls[-2:] == ["abort", "flush"]
    assert app.errors == {"app: CONCURRENT_TRANSACTIONS": 1, "app: INVALID_TXN_STATE": 1}
    assert consumer.seeks == [(0, 3)]


def test_a_rewind_answered_unstable_asks_again_instead_of_replaying_from_the_start(
        monkeypatch):
    monkeypatch.setattr(txn_workload.time, "sleep", lambda s: None)
    app, _ = workload(monkeypatch)
    unstable = confluent_kafka.KafkaError(confluent_kafka.KafkaError.UNSTABLE_OFFSET_COMMIT)
    consumer = FakeConsumer([[committed(-1001, unstable)], [committed(40)]])
    app._rewind(consumer)  # type: ignore[arg-type]
    assert consumer.seeks == [(0, 40)]


def test_a_rewind_whose_call_fails_while_the_coordinator_moves_asks_again(monkeypatch):
    """Seen in a chaos run: the app thread died of NOT_COORDINATOR "Failed to get
    committed offsets" while brokers were killed, which librdkafka does not mark
    retriable."""
    monkeypatch.setattr(txn_workload.time, "sleep", lambda s: None)
    app, _ = workload(monkeypatch)
    moved = confluent_kafka.KafkaError(confluent_kafka.KafkaError.NOT_COORDINATOR,
                                       "Failed to get committed offsets")
    timed_out = confluent_kafka.KafkaError(confluent_kafka.KafkaError._TIMED_OUT)
    consumer = FakeConsumer([moved, timed_out, [committed(12)]])
    app._rewind(consumer)  # type: ignore[arg-type]
    assert consumer.seeks == [(0, 12)]
    assert app.errors == {"app: NOT_COORDINATOR": 1, "app: _TIMED_OUT": 1}


def test_a_rewind_refused_for_good_is_raised_and_seeks_nothing(monkeypatch):
    monkeypatch.setattr(txn_workload.time, "sleep", lambda s: None)
    app, _ = workload(monkeypatch)
    denied = confluent_kafka.KafkaError(confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED)
    consumer = FakeConsumer([denied, [committed(12)]])
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        app._rewind(consumer)  # type: ignore[arg-type]
    assert raised.value.args[0].code() == confluent_kafka.KafkaError.GROUP_AUTHORIZATION_FAILED
    assert consumer.seeks == []


def test_a_rewind_gives_up_at_its_deadline(monkeypatch):
    clock = iter(range(0, 10_000, 30))
    monkeypatch.setattr(txn_workload.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(txn_workload.time, "sleep", lambda s: None)
    app, _ = workload(monkeypatch)
    moved = confluent_kafka.KafkaError(confluent_kafka.KafkaError.NOT_COORDINATOR)
    consumer = FakeConsumer([moved])
    with pytest.raises(confluent_kafka.KafkaException):
        app._rewind(consumer)  # type: ignore[arg-type]
    assert app.errors["app: NOT_COORDINATOR"] == txn_workload.REWIND_TIMEOUT_S // 30
