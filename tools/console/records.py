"""The record browser: read a few records of one partition and show them.

Where to start (``RecordQuery.mode``):

- ``newest``: the last ``limit`` records below the high watermark;
- ``offset``: from ``offset`` on (clamped to the log: below its start means its start);
- ``timestamp``: from the first record at or after ``timestamp_ms`` (the broker's
  time index, ``ListOffsets`` as ``offsets_for_times``).

With ``key`` set only records whose key, shown as text, equals it are kept, and the
scan goes on past ``limit`` records read, up to ``SCAN_RECORDS_MAX`` and
``SCAN_TIME_MS_MAX``, whichever comes first: a browser never waits on a long log.

Keys, values and headers are shown as ``text`` (UTF-8, bad bytes replaced), ``json``
(pretty; text when it does not parse) or ``hex``; the first ``PREVIEW_BYTES_MAX`` bytes
only, with the full length said, and one record's page shows all of it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tidewater.client.consumer import Consumer
from tidewater.client.metadata import TopicPartition
from tidewater.proto.records import ConsumerRecord

LIMIT_MAX = 500
SCAN_RECORDS_MAX = 20_000
SCAN_TIME_MS_MAX = 3000
PREVIEW_BYTES_MAX = 1024
FORMATS = ("text", "json", "hex")
MODES = ("newest", "offset", "timestamp")


@dataclass(frozen=True, slots=True)
class RecordQuery:
    partition: int = 0
    mode: str = "newest"
    limit: int = 20
    offset: int = 0
    timestamp_ms: int = 0
    key: str | None = None
    fmt: str = "text"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}")
        if self.fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}")
        if not 1 <= self.limit <= LIMIT_MAX:
            raise ValueError(f"limit must be in [1, {LIMIT_MAX}]")
        if self.partition < 0 or self.offset < 0:
            raise ValueError("partition and offset must not be negative")


@dataclass(frozen=True, slots=True)
class Shown:
    """A key, value or header value as the page shows it."""

    text: str
    length: int  # bytes; -1 for null
    cut: bool  # only the first PREVIEW_BYTES_MAX bytes are in ``text``
    as_json: bool  # ``json`` was asked and the bytes parsed

    @property
    def is_null(self) -> bool:
        return self.length < 0


@dataclass(frozen=True, slots=True)
class ShownRecord:
    offset: int
    timestamp_ms: int
    leader_epoch: int
    key: Shown
    value: Shown
    headers: tuple[tuple[str, Shown], ...]


@dataclass(frozen=True, slots=True)
class RecordPage:
    topic: str
    query: RecordQuery
    log_start_offset: int
    high_watermark: int
    start_offset: int
    records: tuple[ShownRecord, ...]
    scanned: int
    scan_cut: bool  # a key filter stopped before the end (records or time limit)


def show(data: bytes | None, fmt: str, preview_bytes: int | None = PREVIEW_BYTES_MAX) -> Shown:
    if data is None:
        return Shown("null", -1, False, False)
    cut = preview_bytes is not None and len(data) > preview_bytes
    if fmt == "json" and not cut:
        try:
            parsed = json.loads(data)
        except ValueError:
            pass
        else:
            return Shown(json.dumps(parsed, indent=2, ensure_ascii=False), len(data), False, True)
    part = data[:preview_bytes] if cut else data
    if fmt == "hex":
        lines = [part[i:i + 16].hex(" ") for i in range(0, len(part), 16)]
        return Shown("\n".join(lines), len(data), cut, False)
    return Shown(part.decode("utf-8", errors="replace"), len(data), cut, False)


def shown_record(r: ConsumerRecord, fmt: str,
                 preview_bytes: int | None = PREVIEW_BYTES_MAX) -> ShownRecord:
    return ShownRecord(r.offset, r.timestamp, r.leader_epoch, show(r.key, "text" if fmt == "json"
                                                                   else fmt, preview_bytes),
                       show(r.value, fmt, preview_bytes),
                       tuple((name, show(v, fmt, preview_bytes)) for name, v in r.headers))


class RecordReader:
    """One consumer (no group) shared by the browser's requests, one at a time."""

    def __init__(self, bootstrap: str, security: Mapping[str, Any] | None = None) -> None:
        self._consumer = Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                                  request_timeout_ms=5000, **(security or {}))
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._consumer.close()

    def read(self, topic: str, q: RecordQuery) -> RecordPage:
        tp = TopicPartition(topic, q.partition)
        with self._lock:
            c = self._consumer
            if q.partition not in c.partitions_for(topic):
                raise LookupError(f"{topic} has no partition {q.partition}")
            begin = c.beginning_offsets([tp])[tp]
            end = c.end_offsets([tp])[tp]
            if q.mode == "newest":
                start = max(begin, end - q.limit)
            elif q.mode == "offset":
                start = min(max(q.offset, begin), end)
            else:
                found = c.offsets_for_times([tp], q.timestamp_ms).get(tp, -1)
                start = found if found >= 0 else end
            kept: list[ShownRecord] = []
            scanned = 0
            scan_cut = False
            if start < end:
                c.assign([tp])
                c.seek(tp, start)
                deadline = time.monotonic() + SCAN_TIME_MS_MAX / 1000
                position = start
                while position < end and len(kept) < q.limit:
                    if time.monotonic() > deadline or scanned >= SCAN_RECORDS_MAX:
                        scan_cut = True
                        break
                    batch = c.poll(timeout_ms=500, max_records=max(q.limit, 500))
                    for r in batch:
                        if r.offset >= end or len(kept) >= q.limit:
                            break
                        scanned += 1
                        position = r.offset + 1
                        if q.key is not None and (r.key is None or
                                                  r.key.decode("utf-8", "replace") != q.key):
                            continue
                        kept.append(shown_record(r, q.fmt))
                    if not batch and time.monotonic() > deadline:
                        scan_cut = position < end
                        break
                c.assign([])
            return RecordPage(topic, q, begin, end, start, tuple(kept), scanned, scan_cut)

    def one(self, topic: str, partition: int, offset: int, fmt: str) -> ShownRecord | None:
        """The record at ``offset`` in full, or None when the log does not hold it."""
        tp = TopicPartition(topic, partition)
        with self._lock:
            c = self._consumer
            begin = c.beginning_offsets([tp])[tp]
            end = c.end_offsets([tp])[tp]
            if not begin <= offset < end:
                return None
            c.assign([tp])
            c.seek(tp, offset)
            deadline = time.monotonic() + SCAN_TIME_MS_MAX / 1000
            try:
                while time.monotonic() < deadline:
                    for r in c.poll(timeout_ms=500, max_records=1):
                        if r.offset >= offset:
                            return shown_record(r, fmt, None) if r.offset == offset else None
            finally:
                c.assign([])
            return None
