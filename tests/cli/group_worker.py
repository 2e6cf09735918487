"""One consumer-group member for the group tests, as its own process (so it can be
SIGKILLed): ``python group_worker.py LIBRARY BOOTSTRAP GROUP TOPIC``.

LIBRARY is confluent, kafka-python, aiokafka or tidewater. It subscribes to TOPIC in
GROUP (earliest when there is no committed offset, 3 s session timeout; with
GROUP_INSTANCE_ID in the environment a confluent member is static, with a 20 s one),
prints one
line ``R <partition> <offset>`` per record it processed, then commits synchronously
(at least once: a record is printed before its offset is committed), and prints
``A <partitions>`` after each assignment. SIGTERM closes the consumer (LeaveGroup).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

SESSION_MS = 3000
STATIC_SESSION_MS = 20000  # long enough for a restart to come back first
HEARTBEAT_MS = 500
stopping = False


def _stop(*_args) -> None:
    global stopping
    stopping = True


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_confluent(bootstrap: str, group: str, topic: str) -> None:
    from confluent_kafka import Consumer
    config = {"bootstrap.servers": bootstrap, "group.id": group,
              "auto.offset.reset": "earliest", "enable.auto.commit": False,
              "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS}
    if os.environ.get("GROUP_INSTANCE_ID"):  # static membership (KIP-345)
        config["group.instance.id"] = os.environ["GROUP_INSTANCE_ID"]
        config["session.timeout.ms"] = STATIC_SESSION_MS
    consumer = Consumer(config)
    consumer.subscribe([topic], on_assign=lambda c, parts: say(
        "A " + ",".join(str(p.partition) for p in parts)))
    while not stopping:
        messages = consumer.consume(100, 0.2)
        for m in messages:
            if m.error() is None:
                say(f"R {m.partition()} {m.offset()}")
        if messages:
            try:
                consumer.commit(asynchronous=False)
            except Exception as e:  # a rebalance meanwhile: the next owner reads again
                say(f"E {e}")
    consumer.close()


def run_kafka_python(bootstrap: str, group: str, topic: str) -> None:
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            say("A " + ",".join(str(p.partition) for p in assigned))
    consumer = KafkaConsumer(bootstrap_servers=bootstrap.split(","), group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS)
    consumer.subscribe([topic], listener=Listener())
    while not stopping:
        batches = consumer.poll(timeout_ms=200)
        for records in batches.values():
            for r in records:
                say(f"R {r.partition} {r.offset}")
        if batches:
            try:
                consumer.commit()
            except Exception as e:
                say(f"E {e}")
    consumer.close()


async def run_aiokafka(bootstrap: str, group: str, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.abc import ConsumerRebalanceListener

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            pass

        async def on_partitions_assigned(self, assigned):
            say("A " + ",".join(str(p.partition) for p in assigned))
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=SESSION_MS,
                                heartbeat_interval_ms=HEARTBEAT_MS)
    consumer.subscribe([topic], listener=Listener())
    await consumer.start()
    try:
        while not stopping:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for r in records:
                    say(f"R {r.partition} {r.offset}")
            if batches:
                try:
                    await consumer.commit()
                except Exception as e:
                    say(f"E {e}")
    finally:
        await consumer.stop()


def run_tidewater(bootstrap: str, group: str, topic: str) -> None:
    from tidewater.client.consumer import Consumer
    instance = os.environ.get("GROUP_INSTANCE_ID") or None  # static membership (KIP-345)
    consumer = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest",
                        enable_auto_commit=False,
                        session_timeout_ms=STATIC_SESSION_MS if instance else SESSION_MS,
                        heartbeat_interval_ms=HEARTBEAT_MS, group_instance_id=instance)
    consumer.subscribe([topic], on_assign=lambda parts: say(
        "A " + ",".join(str(p) for _, p in sorted(parts))))
    while not stopping:
        records = consumer.poll(timeout_ms=200)
        for r in records:
            say(f"R {r.partition} {r.offset}")
        if records:
            try:
                consumer.commit()
            except Exception as e:
                say(f"E {e}")
    consumer.close()


def main() -> None:
    library, bootstrap, group, topic = sys.argv[1:5]
    signal.signal(signal.SIGTERM, _stop)
    if library == "confluent":
        run_confluent(bootstrap, group, topic)
    elif library == "kafka-python":
        run_kafka_python(bootstrap, group, topic)
    elif library == "aiokafka":
        asyncio.run(run_aiokafka(bootstrap, group, topic))
    elif library == "tidewater":
        run_tidewater(bootstrap, group, topic)
    else:
        raise SystemExit(f"unknown library {library}")
    say("CLOSED")


if __name__ == "__main__":
    main()
