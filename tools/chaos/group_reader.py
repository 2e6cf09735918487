"""A consumer-group member reading the chaos topic during the faults.

One Tidewater ``Consumer`` in group ``chaos-<run id>`` subscribes to the topic, commits
after each batch it read (at least once) and, after each commit the coordinator
acknowledged, asks the coordinator what is committed (OffsetFetch) and records it.
Every error is counted and ridden out (the coordinator's broker may be the one
killed). After the faults ``drain`` reads on until the group has consumed everything
below the end offsets. The verdict (``verdict.judge_group``) then asks: was every
acknowledged record consumed by the group, and did the committed offsets the
coordinator reported ever go backwards (a lost commit)?
"""

from __future__ import annotations

import collections
import threading
import time

from tidewater.client.consumer import Consumer
from tidewater.client.metadata import TopicPartition
from tidewater.client.security import SecurityOptions
from tidewater.proto.errors import TidewaterError

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000


class GroupReader:
    def __init__(self, bootstrap: str, topic: str, partitions: list[int], group_id: str, *,
                 security: SecurityOptions | None = None) -> None:
        self.bootstrap = bootstrap
        self.security: SecurityOptions = security or {}  # the clients' TLS options (Consumer's keywords)
        self.topic = topic
        self.partitions = partitions
        self.group_id = group_id
        self.consumed: set[tuple[int, int]] = set()
        # partition -> committed offsets as the coordinator reported them, in time order
        self.committed: dict[int, list[int]] = collections.defaultdict(list)
        self.errors: collections.Counter[str] = collections.Counter()
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-group-reader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def drain(self, ends: dict[int, int], timeout_s: float, *, compacted: bool = False) -> bool:
        """Wait until every offset below ``ends`` was consumed (False after the timeout);
        ``compacted``: until the last one was (the cleaner leaves gaps below it, but never
        removes a partition's last record: no later record of its key)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if compacted:
                    done = all(end == 0 or (p, end - 1) in self.consumed
                               for p, end in ends.items())
                else:
                    done = all((p, o) in self.consumed for p, end in ends.items()
                               for o in range(end))
                if done:
                    return True
            if self._thread is None or not self._thread.is_alive():
                return False
            time.sleep(0.5)
        return False

    def snapshot(self) -> tuple[set[tuple[int, int]], dict[int, list[int]]]:
        with self._lock:
            return set(self.consumed), {p: list(v) for p, v in self.committed.items()}

    def _run(self) -> None:
        try:
            consumer = Consumer(self.bootstrap, group_id=self.group_id, client_id="chaos-group",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=SESSION_TIMEOUT_MS,
                                heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
                                request_timeout_ms=10000, **self.security)
        except BaseException as e:
            self.failure = e
            return
        tps = [TopicPartition(self.topic, p) for p in self.partitions]
        try:
            consumer.subscribe([self.topic])
            while not self._stop.is_set():
                try:
                    records = consumer.poll(500)
                except TidewaterError as e:
                    self.errors[f"poll: {type(e).__name__}"] += 1
                    time.sleep(0.2)
                    continue
                with self._lock:
                    self.consumed.update((r.partition, r.offset) for r in records)
                if not records:
                    continue
                try:
                    consumer.commit()
                    committed = consumer.committed(tps)
                except TidewaterError as e:
                    self.errors[f"commit: {type(e).__name__}"] += 1
                    continue
                with self._lock:
                    for tp, offset in committed.items():
                        if offset >= 0:
                            self.committed[tp.partition].append(offset)
        except BaseException as e:  # reported in the verdict's notes
            self.failure = e
        finally:
            consumer.close()
