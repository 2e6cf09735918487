"""The transactional chaos workload (``tide chaos --transactional``): exactly-once
consume-transform-produce through the Kafka listener, with confluent-kafka.

Three parts, each its own thread:

- the feeder: an idempotent producer (acks=all) writes ``<run_id>-in-<seq>`` to the
  input topic; a value whose delivery report carries no error is *acknowledged*;
- the app: a consumer in group ``<run_id>-eos`` (read_committed) and a transactional
  producer (``transactional.id`` ``<run_id>-eos``); per batch of input records it begins
  a transaction, writes ``out-<input value>`` to the output topic, adds the batch's
  next offsets with ``send_offsets_to_transaction`` and commits. An abortable error
  aborts and rewinds the consumer to the group's committed offsets (Kafka's EOS
  pattern); a fatal error (fenced, the producer's epoch lost, or an abort the
  coordinator refuses) makes a new producer with the same transactional.id, whose
  ``init_transactions`` fences the old one and aborts whatever it left open, and
  rewinds likewise. So does a call that outlives its timeout (``StuckCallError``):
  librdkafka 2.10+ can block ``send_offsets_to_transaction`` forever, past its
  timeout, once the group coordinator it cached drops out of the metadata (a killed
  broker is decommissioned): confluentinc/librdkafka#5511 and #5456, both open. Such a
  call runs in a helper thread (``bounded_call``); when it hangs, its producer is left to
  it (never closed: the thread still uses it);
- after the faults (``finish``): the feeder stops and flushes, the app runs on until
  the group's committed offsets reach the input's end offsets, then stops.

The verdict (``verdict.judge_transactional``) reads the output topic with
read_committed and the input topic: an acknowledged input without its output is
lost, an output found more often than its input is in the input topic is duplicated
(goal: 0 and 0); inputs the feeder's client wrote twice are counted apart.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Callable

import confluent_kafka

from tidewater.client.security import SecurityOptions

OUTPUT_PREFIX = "out-"
BATCH_RECORDS_MAX = 20
TRANSACTION_TIMEOUT_MS = 20000
CLIENT_CALL_TIMEOUT_S = 30.0
INPUT_QUEUE_RECORDS_MAX = 10000
READ_BACK_TIMEOUT_S = 120.0
# Past its own timeout a bounded client call gets this long before it counts as stuck.
STUCK_CALL_GRACE_S = 10.0
# How long a rewind asks again while OffsetFetch fails (UNSTABLE_OFFSET_COMMIT on a
# partition, or the whole call while the group's coordinator moves with a killed broker).
REWIND_TIMEOUT_S = 90.0
REWIND_RETRY_S = 0.5


class StuckCallError(Exception):
    """A client call still running well past its own timeout (librdkafka#5511)."""


def bounded_call(call: Callable[[], None], timeout_s: float, what: str,
                 grace_s: float | None = None) -> None:
    """``call()`` in a daemon thread, waited for ``timeout_s`` + ``grace_s`` (default
    ``STUCK_CALL_GRACE_S``): its exception re-raised, or StuckCallError (the thread is
    left blocked). tests/cli/eos_app.py uses it too."""
    grace = STUCK_CALL_GRACE_S if grace_s is None else grace_s
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)
    worker = threading.Thread(target=run, name=f"chaos-txn-{what}", daemon=True)
    worker.start()
    worker.join(timeout_s + grace)
    if not outcome:
        raise StuckCallError(f"{what} still blocked {timeout_s + grace:.0f} s "
                             f"after its call (timeout {timeout_s:.0f} s)")
    if outcome[0] is not None:
        raise outcome[0]


# Errors of a consumer's OffsetFetch that pass once the group's coordinator is found
# again; librdkafka does not mark all of them retriable.
PASSING_CODES = frozenset({
    confluent_kafka.KafkaError.NOT_COORDINATOR,
    confluent_kafka.KafkaError.COORDINATOR_NOT_AVAILABLE,
    confluent_kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    confluent_kafka.KafkaError.REQUEST_TIMED_OUT,
    confluent_kafka.KafkaError._TIMED_OUT,
    confluent_kafka.KafkaError._TRANSPORT,
    confluent_kafka.KafkaError._WAIT_COORD,
})


def passes(error: object) -> bool:
    """Whether a consumer call's error is one to ask again after."""
    if not isinstance(error, confluent_kafka.KafkaError):
        return False
    return error.retriable() or error.code() in PASSING_CODES


def _retire(producer: confluent_kafka.Producer) -> None:
    """Let go of a producer in a fatal state: its flush raises that fatal error again
    (seen: a run's app thread died of the INVALID_TXN_STATE its abort had just had)."""
    try:
        producer.flush(0)
    except confluent_kafka.KafkaException:
        pass


def kafka_config(security: SecurityOptions) -> dict[str, str]:
    """The chaos clients' TLS (and, on a SASL_SSL cluster, SASL) options in librdkafka's
    names; {} for plaintext."""
    protocol = security.get("security_protocol")
    if protocol not in ("SSL", "SASL_SSL"):
        return {}
    config = {"security.protocol": str(protocol)}
    names = [("ssl_cafile", "ssl.ca.location"), ("ssl_certfile", "ssl.certificate.location"),
             ("ssl_keyfile", "ssl.key.location")]
    if protocol == "SASL_SSL":
        names += [("sasl_mechanism", "sasl.mechanism"), ("sasl_plain_username", "sasl.username"),
                  ("sasl_plain_password", "sasl.password")]
    for ours, theirs in names:
        value = security.get(ours)
        if value:
            config[theirs] = str(value)
    return config


class TxnWorkload:
    def __init__(self, kafka_bootstrap: str, source_topic: str, sink_topic: str, *,
                 run_id: str, rate_per_s: float, security: SecurityOptions | None = None):
        if rate_per_s <= 0:
            raise ValueError("the transactional workload needs a positive rate")
        self.source_topic = source_topic
        self.sink_topic = sink_topic
        self.run_id = run_id
        self.group_id = f"{run_id}-eos"
        self.transactional_id = f"{run_id}-eos"
        self.interval_s = 1.0 / rate_per_s
        # librdkafka logs every refused connection to stderr, and chaos refuses many:
        # critical only (failures reach the workload as errors and are counted).
        self.base = {"bootstrap.servers": kafka_bootstrap, "log_level": 2,
                     **kafka_config(security or {})}
        self.sent: set[str] = set()
        self.acked: set[str] = set()
        self.errors: collections.Counter[str] = collections.Counter()
        self.transactions_committed = 0
        self.transactions_aborted = 0
        self.producers_created = 0  # 1 + producers made after a fatal error
        # When the first and the last transaction committed (did faults fall between?)
        self.first_commit_unix_ms = 0
        self.last_commit_unix_ms = 0
        self.failure: BaseException | None = None  # a thread died (reported by the runner)
        self._lock = threading.Lock()
        self._stop_feeding = threading.Event()
        self._stop_app = threading.Event()
        self._committed_next: dict[int, int] = {}  # input partition -> next offset committed
        self._feeder = threading.Thread(target=self._feed, name="chaos-txn-feeder", daemon=True)
        self._app = threading.Thread(target=self._run_app, name="chaos-txn-app", daemon=True)

    @property
    def input_prefix(self) -> str:
        return f"{self.run_id}-in-"

    def start(self) -> None:
        self._feeder.start()
        self._app.start()

    def wait_first_commit(self, timeout_s: float) -> bool:
        """Wait until the app committed its first transaction (its coordinator found, its
        producer id given, its group joined): the faults are for its transactions.
        False: not within ``timeout_s``, or a thread of the workload died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.first_commit_unix_ms or self.failure is not None:
                break
            if not (self._app.is_alive() and self._feeder.is_alive()):
                break
            time.sleep(0.1)
        return bool(self.first_commit_unix_ms)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"inputs_sent": len(self.sent), "inputs_acked": len(self.acked),
                    "committed": self.transactions_committed,
                    "aborted": self.transactions_aborted}

    # ------------------------------------------------------------------ feeder

    def _on_delivery(self, error: confluent_kafka.KafkaError | None,
                     message: confluent_kafka.Message) -> None:
        value = (message.value() or b"").decode()
        with self._lock:
            if error is None:
                self.acked.add(value)
            else:
                self.errors[f"input: {error.name()}"] += 1

    def _feed(self) -> None:
        producer = confluent_kafka.Producer({
            **self.base, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": 30000, "queue.buffering.max.messages": INPUT_QUEUE_RECORDS_MAX})
        seq = 0
        next_at = time.monotonic()
        try:
            while not self._stop_feeding.is_set():
                value = f"{self.input_prefix}{seq:09d}"
                try:
                    producer.produce(self.source_topic, value=value.encode(),
                                     on_delivery=self._on_delivery)
                except BufferError:  # the cluster stalls: wait for room, send nothing new
                    producer.poll(0.1)
                    continue
                with self._lock:
                    self.sent.add(value)
                seq += 1
                producer.poll(0)
                next_at += self.interval_s
                self._stop_feeding.wait(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at, time.monotonic() - 1.0)  # no burst after a stall
        except BaseException as e:
            self.failure = e
        finally:
            # Every input resolves: acknowledged, or failed after message.timeout.ms.
            left = producer.flush(60)
            if left:
                with self._lock:
                    self.errors["input: unresolved at close"] += left

    # ------------------------------------------------------------------ the app

    def _new_producer(self) -> confluent_kafka.Producer:
        while True:
            producer = confluent_kafka.Producer({
                **self.base, "transactional.id": self.transactional_id,
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS, "linger.ms": 5})
            try:
                producer.init_transactions(CLIENT_CALL_TIMEOUT_S)
            except confluent_kafka.KafkaException as e:  # the coordinator moves: try again
                self._count(e)
                if self._stop_app.is_set():
                    raise
                continue
            with self._lock:
                self.producers_created += 1
            return producer

    def _count(self, e: Exception) -> None:
        error = e.args[0] if e.args else None
        name = error.name() if isinstance(error, confluent_kafka.KafkaError) else type(e).__name__
        with self._lock:
            self.errors[f"app: {name}"] += 1

    def _rewind(self, consumer: confluent_kafka.Consumer) -> None:
        """Seek every assigned partition to the group's committed offset (the beginning
        when it has none). A partition answered with an error (UNSTABLE_OFFSET_COMMIT
        while a transaction's offsets wait for its marker) has no offset to go by:
        asked again, never taken for "none committed" (that replays the partition from
        its start and duplicates its outputs)."""
        assignment = consumer.assignment()
        if not assignment:
            return
        committed = self._committed_offsets(consumer, assignment)
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else confluent_kafka.OFFSET_BEGINNING
            consumer.seek(confluent_kafka.TopicPartition(tp.topic, tp.partition, offset))

    def _committed_offsets(self, consumer: confluent_kafka.Consumer,
                           assignment: list[confluent_kafka.TopicPartition],
                           ) -> list[confluent_kafka.TopicPartition]:
        """The group's committed offsets for ``assignment``, asked again while the
        answer fails in a way that passes: a partition's error, or the whole call failing
        with a coordinator error or a timeout (seen: NOT_COORDINATOR "Failed to get
        committed offsets" while brokers were killed). Anything else is raised."""
        deadline = time.monotonic() + REWIND_TIMEOUT_S
        while True:
            try:
                committed = consumer.committed(assignment, timeout=CLIENT_CALL_TIMEOUT_S)
            except confluent_kafka.KafkaException as e:
                if not passes(e.args[0]) or time.monotonic() > deadline:
                    raise
                self._count(e)
            else:
                failed = [tp for tp in committed if tp.error is not None]
                if not failed:
                    return committed
                if time.monotonic() > deadline:
                    raise confluent_kafka.KafkaException(failed[0].error)
            time.sleep(REWIND_RETRY_S)

    def _run_app(self) -> None:
        consumer = confluent_kafka.Consumer({
            **self.base, "group.id": self.group_id, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "isolation.level": "read_committed",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        producer: confluent_kafka.Producer | None = None
        try:
            producer = self._new_producer()
            consumer.subscribe([self.source_topic])
            while not self._stop_app.is_set():
                records = [r for r in consumer.consume(BATCH_RECORDS_MAX, timeout=0.5)
                           if r.error() is None]
                if not records:
                    continue
                producer = self._transact(producer, consumer, records)
        except BaseException as e:
            self.failure = e
        finally:
            consumer.close()
            if producer is not None:
                producer.flush(10)

    def _transact(self, producer: confluent_kafka.Producer, consumer: confluent_kafka.Consumer,
                  records: list[confluent_kafka.Message]) -> confluent_kafka.Producer:
        """One transaction of ``records``; returns the producer to use next."""
        next_offsets: dict[tuple[str, int], int] = {}
        for r in records:
            next_offsets[(r.topic() or "", r.partition() or 0)] = (r.offset() or 0) + 1
        try:
            producer.begin_transaction()
            for r in records:
                producer.produce(self.sink_topic, value=OUTPUT_PREFIX.encode() + (r.value() or b""))
            offsets = [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in next_offsets.items()]
            group = consumer.consumer_group_metadata()
            send = producer.send_offsets_to_transaction
            bounded_call(lambda: send(offsets, group, CLIENT_CALL_TIMEOUT_S), CLIENT_CALL_TIMEOUT_S,
                     "send_offsets_to_transaction")
            self._commit(producer)
        except (confluent_kafka.KafkaException, StuckCallError) as e:
            self._count(e)
            producer = self._recover(producer, e)
            with self._lock:
                self.transactions_aborted += 1
            self._rewind(consumer)
            return producer
        now_ms = int(time.time() * 1000)
        with self._lock:
            self.transactions_committed += 1
            self.first_commit_unix_ms = self.first_commit_unix_ms or now_ms
            self.last_commit_unix_ms = now_ms
            for (_topic, partition), offset in next_offsets.items():
                self._committed_next[partition] = offset
        return producer

    def _recover(self, producer: confluent_kafka.Producer,
                 e: confluent_kafka.KafkaException | StuckCallError) -> confluent_kafka.Producer:
        """The producer to go on with after a failed transaction: the same one once its
        transaction is aborted, else a new one."""
        if isinstance(e, StuckCallError):
            # Still in use by the blocked call: neither flushed nor closed. The new
            # producer's init_transactions fences it and aborts its transaction.
            return self._new_producer()
        if e.args[0].fatal():
            # Fenced or epoch lost: this producer can do nothing more. A new one with
            # the same transactional.id aborts what this one left open.
            _retire(producer)
            return self._new_producer()
        try:
            self._abort(producer)
            return producer
        except confluent_kafka.KafkaException as abort_error:
            # The abort itself failed for good: e.g. EndTxn(abort) answered
            # INVALID_TXN_STATE (fatal in librdkafka) because none of this transaction's
            # partitions got in while the coordinator finished the previous commit.
            self._count(abort_error)
            _retire(producer)
            return self._new_producer()

    def _commit(self, producer: confluent_kafka.Producer) -> None:
        """A retriable failure (a timeout) leaves the outcome open: commit again, as
        librdkafka's documentation says; an abortable or fatal one goes to the caller."""
        while True:
            try:
                producer.commit_transaction(CLIENT_CALL_TIMEOUT_S)
                return
            except confluent_kafka.KafkaException as e:
                if not e.args[0].retriable():
                    raise
                self._count(e)

    def _abort(self, producer: confluent_kafka.Producer) -> None:
        while True:
            try:
                producer.abort_transaction(CLIENT_CALL_TIMEOUT_S)
                return
            except confluent_kafka.KafkaException as e:
                if not e.args[0].retriable():
                    raise
                self._count(e)

    # ------------------------------------------------------------------ the end

    def finish(self, timeout_s: float) -> str:
        """Stop feeding, let the app commit every input, stop it; '' or why not."""
        self._stop_feeding.set()
        self._feeder.join(90)
        why = ""
        try:
            ends = self._input_end_offsets()
        except confluent_kafka.KafkaException as e:
            ends, why = {}, f"transactional: no input end offsets: {e}"
        deadline = time.monotonic() + timeout_s
        while ends and self.failure is None:
            with self._lock:
                behind = {p: (self._committed_next.get(p, 0), end) for p, end in ends.items()
                          if self._committed_next.get(p, 0) < end}
            if not behind:
                break
            if time.monotonic() > deadline:
                why = (f"transactional: the app did not commit the whole input within "
                       f"{timeout_s:.0f} s (committed, end per partition: {behind})")
                break
            time.sleep(0.2)
        self._stop_app.set()
        self._app.join(90)
        return why

    def _input_end_offsets(self) -> dict[int, int]:
        consumer = confluent_kafka.Consumer({**self.base, "group.id": f"{self.run_id}-ends"})
        try:
            meta = consumer.list_topics(self.source_topic, timeout=CLIENT_CALL_TIMEOUT_S)
            partitions = sorted(meta.topics[self.source_topic].partitions)
            return {p: consumer.get_watermark_offsets(
                        confluent_kafka.TopicPartition(self.source_topic, p),
                        timeout=CLIENT_CALL_TIMEOUT_S)[1]
                    for p in partitions}
        finally:
            consumer.close()

    def read_output(self) -> tuple[list[str], str]:
        """Every value of the output topic read with read_committed, from the start to
        each partition's end (the LSO: no transaction is open once the app stopped)."""
        return self._read_all(self.sink_topic, "output")

    def read_input(self) -> tuple[list[str], str]:
        """Every value of the input topic: a value the feeder sent once may be there twice
        (librdkafka re-sends a batch whose messages timed out under a new epoch from
        sequence 0, though the broker may have it: confluentinc/librdkafka#4953), and
        the app must process each copy once."""
        return self._read_all(self.source_topic, "input")

    def _read_all(self, topic: str, what: str) -> tuple[list[str], str]:
        consumer = confluent_kafka.Consumer({
            **self.base, "group.id": f"{self.run_id}-verdict-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed", "enable.partition.eof": True,
            "enable.auto.commit": False})
        values: list[str] = []
        try:
            meta = consumer.list_topics(topic, timeout=CLIENT_CALL_TIMEOUT_S)
            partitions = sorted(meta.topics[topic].partitions)
            consumer.assign([confluent_kafka.TopicPartition(topic, p,
                                                            confluent_kafka.OFFSET_BEGINNING)
                             for p in partitions])
            at_end: set[int] = set()
            deadline = time.monotonic() + READ_BACK_TIMEOUT_S
            while len(at_end) < len(partitions):
                if time.monotonic() > deadline:
                    return values, (f"transactional: {what} read-back incomplete after "
                                    f"{READ_BACK_TIMEOUT_S:.0f} s")
                for r in consumer.consume(500, timeout=1.0):
                    error = r.error()
                    if error is not None:
                        if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                            at_end.add(r.partition() or 0)
                        continue
                    values.append((r.value() or b"").decode("utf-8", "replace"))
        except confluent_kafka.KafkaException as e:
            return values, f"transactional: {what} read-back failed: {e}"
        finally:
            consumer.close()
        return values, ""
