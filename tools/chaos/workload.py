"""Chaos producers: unique values with acks=all, an ack log, and what was attempted.

Every send attempt carries a new value ``<run_id>-p<producer>-<seq>`` and the
producer never retries (``retries=0``): a failed or timed-out attempt is
simply abandoned and the next value is sent. So each value is sent at most
once. With ``idempotent`` the producers are idempotent with 5 requests in flight
per partition and retry within their delivery timeout: a value is still given to
``send`` once, and a retry the cluster wrote twice shows as a duplicate. After
the run:

- a value acknowledged but absent was lost (must never happen);
- a value present twice was duplicated by the cluster (must never happen);
- a value present but never acknowledged is the normal ambiguity of a
  failed attempt (the write may have committed before the answer was lost);
- a producer's value found before one it sent earlier, in one partition, is
  out of order (must never happen).

With ``keys`` (a compacted topic's run) record ``seq`` of each producer has the key
``verdict.chaos_key(seq, keys)``: the producers overwrite ``keys`` keys in turn, and
an acknowledged value that the cleaner removed under a later one of its key is not
lost (``verdict.judge``).

Partitions are used round-robin so each gets traffic. Sends are paced to
``rate_per_s`` in total and bounded to ``in_flight_max`` unresolved records per
producer, so a stalled cluster does not queue unbounded memory.

Ack log (JSON lines, the format of ``tide produce --ack-log``)::

    {"topic": "demo", "partition": 0, "offset": 17, "key": null,
     "value": "<run_id>-p0-000000042", "acks": "all"}
"""

from __future__ import annotations

import collections
import json
import threading
import time
from functools import partial
from pathlib import Path
from typing import TypedDict

from tidewater.client.producer import Producer, RecordFuture
from tidewater.client.security import SecurityOptions
from tidewater.tools.chaos.verdict import chaos_key

IN_FLIGHT_MAX = 64
REQUEST_TIMEOUT_MS = 5000
DELIVERY_TIMEOUT_MS = 15000
SEND_ERROR_BACKOFF_S = 0.2


class _Retrying(TypedDict, total=False):
    """The Producer's retry settings of a workload (idempotent, or one attempt)."""

    enable_idempotence: bool
    max_in_flight_per_partition: int
    retries: int


class Workload:
    def __init__(self, bootstrap: str, topic: str, partitions: list[int], *, run_id: str,
                 ack_log_path: Path, producers: int = 2, rate_per_s: float = 200.0,
                 in_flight_max: int = IN_FLIGHT_MAX,
                 security: SecurityOptions | None = None, idempotent: bool = False,
                 keys: int = 0):
        if producers < 1 or rate_per_s <= 0:
            raise ValueError("need at least one producer and a positive rate")
        self.bootstrap = bootstrap
        self.security: SecurityOptions = security or {}  # the producers' TLS options
        self.topic = topic
        self.partitions = sorted(partitions)
        self.run_id = run_id
        self.producers = producers
        self.interval_s = producers / rate_per_s  # per producer
        self.in_flight_max = in_flight_max
        self.idempotent = idempotent
        self.keys = keys  # > 0: each record has a key (verdict.chaos_key), for compaction
        self.sent: dict[str, int] = {}  # value -> partition it was sent to
        self.acked: dict[str, tuple[int, int]] = {}  # value -> (partition, offset)
        self.errors: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ack_log = open(ack_log_path, "a", encoding="utf-8")
        self._threads = [threading.Thread(target=self._produce, args=(i,), name=f"chaos-producer-{i}",
                                          daemon=True) for i in range(producers)]
        self._clients: list[Producer] = []
        self.failure: BaseException | None = None

    @property
    def value_prefix(self) -> str:
        return f"{self.run_id}-p"

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop sending, wait for every attempt to resolve, close the ack log."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)
        self._ack_log.close()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"sent": len(self.sent), "acked": len(self.acked),
                    "failed": sum(self.errors.values())}

    def _on_done(self, value: str, key: str | None, fut: RecordFuture,
                 slots: threading.Semaphore) -> None:
        try:
            meta = fut.result()
        except BaseException as e:  # every failure is an abandoned attempt, counted by type
            with self._lock:
                self.errors[type(e).__name__] += 1
        else:
            line = json.dumps({"topic": meta.topic, "partition": meta.partition, "offset": meta.offset,
                               "key": key, "value": value, "acks": "all"})
            with self._lock:
                self.acked[value] = (meta.partition, meta.offset)
                self._ack_log.write(line + "\n")
                self._ack_log.flush()
        finally:
            slots.release()

    def _produce(self, index: int) -> None:
        slots = threading.Semaphore(self.in_flight_max)
        if self.idempotent:  # retries within the delivery timeout, 5 requests in flight
            retrying: _Retrying = {"enable_idempotence": True, "max_in_flight_per_partition": 5}
        else:
            retrying = {"enable_idempotence": False, "retries": 0}
        producer = Producer(self.bootstrap, acks="all", linger_ms=2,
                            request_timeout_ms=REQUEST_TIMEOUT_MS,
                            delivery_timeout_ms=DELIVERY_TIMEOUT_MS, max_block_ms=REQUEST_TIMEOUT_MS,
                            **retrying, **self.security)
        seq = 0
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                if not slots.acquire(timeout=0.5):
                    continue
                value = f"{self.value_prefix}{index}-{seq:09d}"
                key = chaos_key(seq, self.keys) if self.keys else None
                partition = self.partitions[(seq + index) % len(self.partitions)]
                seq += 1
                with self._lock:
                    self.sent[value] = partition
                try:
                    fut = producer.send(self.topic, value.encode(), partition=partition,
                                        key=key.encode() if key is not None else None)
                except Exception as e:  # metadata unreachable etc.: abandon, back off
                    slots.release()
                    with self._lock:
                        self.errors[type(e).__name__] += 1
                    self._stop.wait(SEND_ERROR_BACKOFF_S)
                    continue
                fut.add_done_callback(partial(self._on_done, value, key, slots=slots))
                next_at += self.interval_s
                self._stop.wait(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at, time.monotonic() - 1.0)  # no burst after a stall
        except BaseException as e:  # reported by the runner; a dead producer must not pass silently
            self.failure = e
        finally:
            # Every attempt resolves (acked, failed or expired by the delivery timeout).
            try:
                producer.close(timeout_s=DELIVERY_TIMEOUT_MS / 1000 + 10)
            except Exception as e:  # unresolved attempts stay unacknowledged
                with self._lock:
                    self.errors[f"close: {type(e).__name__}"] += 1
