"""Seconds without a working leader, per partition, as the host sees the cluster.

Every ``sample_ms`` the monitor asks any reachable broker for Metadata. A
partition counts as leaderless for the time since the previous sample when
the answer says leader -1, when the named leader is a broker chaos has
impaired right now (killed, paused or cut off: the controller has not
noticed yet, so clients cannot write), or when no broker answers at all.
Samples go to a JSON lines timeline::

    {"unix_ms": 1700000000000, "leaders": {"0": 1, "1": -1, "2": 3}, "impaired": [2]}

(``leaders`` is ``null`` when no broker answered.)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tidewater.client.metadata import MetadataClient
from tidewater.client.security import ClientSecurity, SecurityOptions
from tidewater.proto.errors import TidewaterError

SAMPLE_MS = 250
METADATA_TIMEOUT_MS = 1000


def leaderless(leaders: dict[int, int] | None, partitions: list[int], impaired: set[int]) -> set[int]:
    """The partitions without a working leader in one sample (pure)."""
    if leaders is None:
        return set(partitions)
    return {p for p in partitions if leaders.get(p, -1) < 0 or leaders[p] in impaired}


class LeaderMonitor:
    def __init__(self, bootstrap: str, topic: str, partitions: list[int], *,
                 impaired_brokers: Callable[[], set[int]], timeline_path: Path,
                 sample_ms: int = SAMPLE_MS, security: SecurityOptions | None = None) -> None:
        self.topic = topic
        self.partitions = sorted(partitions)
        self.impaired_brokers = impaired_brokers
        self.sample_ms = sample_ms
        self.no_leader_s = {p: 0.0 for p in self.partitions}
        self._metadata = MetadataClient(bootstrap, request_timeout_ms=METADATA_TIMEOUT_MS,
                                        security=ClientSecurity.from_options(**(security or {})))
        self._timeline = open(timeline_path, "a", encoding="utf-8")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-leader-monitor", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._timeline.close()
        self._metadata.close()

    def snapshot(self) -> dict[int, float]:
        with self._lock:
            return dict(self.no_leader_s)

    def _leaders(self) -> dict[int, int] | None:
        try:
            snap = self._metadata.refresh([self.topic])
        except TidewaterError:
            return None
        info = snap.topics.get(self.topic)
        if info is None:
            return None
        return {p: part.leader for p, part in info.partitions.items()}

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            leaders = self._leaders()
            impaired = set(self.impaired_brokers())
            now = time.monotonic()
            with self._lock:
                for p in leaderless(leaders, self.partitions, impaired):
                    self.no_leader_s[p] += now - last
            last = now
            self._timeline.write(json.dumps({
                "unix_ms": int(time.time() * 1000),
                "leaders": None if leaders is None else {str(p): b for p, b in sorted(leaders.items())},
                "impaired": sorted(impaired)}) + "\n")
            self._timeline.flush()
            self._stop.wait(self.sample_ms / 1000)
