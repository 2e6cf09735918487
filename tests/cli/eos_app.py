"""A consume-transform-produce app with exactly-once semantics (confluent-kafka), run as a
subprocess by test_kafka_txn_e2e.py: reads ``IN`` in group ``GROUP`` (read_committed),
writes ``out-<value>`` to ``OUT`` and commits the input offsets in the same transaction.
It runs until killed. A transaction that fails with an abortable error is aborted and
the consumer is rewound to the group's committed offsets (Kafka's EOS pattern); after a
fatal error (fenced, or an abort the coordinator refuses: EndTxn INVALID_TXN_STATE) a new
producer with the same transactional.id takes over (its init_transactions fences the old
one and aborts what it left open), and the consumer is rewound likewise. So after a
``send_offsets_to_transaction`` that outlives its timeout: librdkafka 2.10+ can block it
forever once the group coordinator it cached drops out of the metadata (a killed broker
is decommissioned; confluentinc/librdkafka#5511, #5456), so it runs in a helper thread
and its producer is left to it.

usage: eos_app.py BOOTSTRAP IN OUT GROUP TRANSACTIONAL_ID PAUSE_S

PAUSE_S: a pause after each transaction, so that the test's kills land mid-run.
"""

from __future__ import annotations

import sys
import time

import confluent_kafka

from tidewater.tools.chaos.txn_workload import StuckCallError, bounded_call

BATCH_RECORDS_MAX = 10
STUCK_AFTER_S = 45  # send_offsets_to_transaction's 30 s timeout, and some


def send_offsets(producer: confluent_kafka.Producer, offsets: list, group: object) -> None:
    """``send_offsets_to_transaction`` in a daemon thread; StuckCallError when it outlives
    its timeout by far (the thread is left blocked, with its producer)."""
    bounded_call(lambda: producer.send_offsets_to_transaction(offsets, group, 30), 30,
                 "send_offsets_to_transaction", grace_s=STUCK_AFTER_S - 30)


def new_producer(bootstrap: str, transactional_id: str) -> confluent_kafka.Producer:
    while True:
        producer = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
            "transaction.timeout.ms": 20000, "linger.ms": 5})
        try:
            producer.init_transactions(60)
            return producer
        except confluent_kafka.KafkaException as e:
            print(f"init_transactions: {e.args[0]}", flush=True)


def rewind(consumer: confluent_kafka.Consumer) -> None:
    """To the group's committed offsets; a partition answered with an error (an
    UNSTABLE_OFFSET_COMMIT the client gave up on) is asked again, never taken for "no
    offset committed" (that replays it from the start: duplicates)."""
    assignment = consumer.assignment()
    if not assignment:
        return
    while True:
        committed = consumer.committed(assignment, timeout=30)
        if all(tp.error is None for tp in committed):
            break
        time.sleep(0.5)
    for tp in committed:
        # No committed offset yet (-1001): from the beginning, as auto.offset.reset.
        offset = tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING
        consumer.seek(confluent_kafka.TopicPartition(tp.topic, tp.partition, offset))


def main() -> int:
    bootstrap, source, sink, group, transactional_id = sys.argv[1:6]
    pause_s = float(sys.argv[6])
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    producer = new_producer(bootstrap, transactional_id)
    consumer.subscribe([source])
    print("started", flush=True)
    while True:
        records = consumer.consume(BATCH_RECORDS_MAX, timeout=0.5)
        records = [r for r in records if r.error() is None]
        if not records:
            continue
        next_offsets: dict[tuple[str, int], int] = {}
        for r in records:
            next_offsets[(r.topic(), r.partition())] = r.offset() + 1
        try:
            producer.begin_transaction()
            for r in records:
                producer.produce(sink, key=r.key(), value=b"out-" + r.value())
            send_offsets(producer, [confluent_kafka.TopicPartition(t, p, o)
                                    for (t, p), o in next_offsets.items()],
                         consumer.consumer_group_metadata())
            commit(producer)
            time.sleep(pause_s)
        except StuckCallError as e:
            print(f"new producer: {e}", flush=True)
            producer = new_producer(bootstrap, transactional_id)
            rewind(consumer)
        except confluent_kafka.KafkaException as e:
            error, replace = e.args[0], e.args[0].fatal()
            if not replace:
                print(f"aborting: {error}", flush=True)
                try:
                    abort(producer)
                except confluent_kafka.KafkaException as abort_error:
                    error, replace = abort_error.args[0], True
            if replace:
                print(f"new producer after: {error}", flush=True)
                producer = new_producer(bootstrap, transactional_id)
            rewind(consumer)


def commit(producer: confluent_kafka.Producer) -> None:
    """A retriable failure (a timeout) leaves the outcome unknown: commit again, as
    librdkafka's documentation says; anything else goes to the caller."""
    while True:
        try:
            producer.commit_transaction(60)
            return
        except confluent_kafka.KafkaException as e:
            if not e.args[0].retriable():
                raise


def abort(producer: confluent_kafka.Producer) -> None:
    while True:
        try:
            producer.abort_transaction(60)
            return
        except confluent_kafka.KafkaException as e:
            if not e.args[0].retriable():
                raise

if __name__ == "__main__":
    sys.exit(main())
