"""A consume-transform-produce app with exactly-once semantics (confluent-kafka), run as a
subprocess by test_kafka_txn_e2e.py: reads ``IN`` in group ``GROUP`` (read_committed),
writes ``out-<value>`` to ``OUT`` and commits the input offsets in the same transaction.
It runs until killed. A transaction that fails with an abortable error is aborted and
the consumer is rewound to the group's committed offsets (Kafka's EOS pattern); a fatal
error (fenced) exits with code 3.

usage: eos_app.py BOOTSTRAP IN OUT GROUP TRANSACTIONAL_ID PAUSE_S

PAUSE_S: a pause after each transaction, so that the test's kills land mid-run.
"""

from __future__ import annotations

import sys
import time

import confluent_kafka

BATCH_RECORDS_MAX = 10


def rewind(consumer: confluent_kafka.Consumer) -> None:
    assignment = consumer.assignment()
    if not assignment:
        return
    for tp in consumer.committed(assignment, timeout=30):
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
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        "transaction.timeout.ms": 20000, "linger.ms": 5})
    producer.init_transactions(60)
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
            producer.send_offsets_to_transaction(
                [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in next_offsets.items()],
                consumer.consumer_group_metadata(), 30)
            commit(producer)
            time.sleep(pause_s)
        except confluent_kafka.KafkaException as e:
            error = e.args[0]
            if error.fatal():
                print(f"fatal: {error}", flush=True)
                return 3
            print(f"aborting: {error}", flush=True)
            abort(producer)
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
