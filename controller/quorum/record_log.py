"""The application the quorum shell replicates until the metadata owner moves onto Raft:
the committed records, in order. It is what the integration tests compare between nodes.

Image (a snapshot's data), big-endian::

    offset  size  field
    0       8     applied_offset   every entry below this offset was applied
    8       4     record_count     then record_count x:
    ..      8     offset
    ..      4     epoch
    ..      4     data_length
    ..      n     data
"""

from __future__ import annotations

import bisect
import struct

from tidewater.controller.raft import Entry, EntryKind
from tidewater.proto.errors import InvariantViolation

IMAGE_HEADER = struct.Struct(">QI")
assert IMAGE_HEADER.size == 12
IMAGE_RECORD = struct.Struct(">QII")
assert IMAGE_RECORD.size == 16


class CommittedRecords:
    """DATA entries applied in offset order (the others only move ``applied_offset``)."""

    def __init__(self) -> None:
        self.applied_offset = 0
        self.records: list[Entry] = []
        self._offsets: list[int] = []

    def apply(self, entry: Entry) -> None:
        if entry.offset < self.applied_offset:
            raise InvariantViolation(f"entry {entry.offset} applied again (applied up to "
                                     f"{self.applied_offset})")
        if entry.kind is EntryKind.DATA:
            self.records.append(entry)
            self._offsets.append(entry.offset)
        self.applied_offset = entry.offset + 1

    def read(self, start_offset: int, records_max: int) -> list[Entry]:
        first = bisect.bisect_left(self._offsets, start_offset)
        return self.records[first:first + records_max]

    def image(self) -> bytes:
        parts = [IMAGE_HEADER.pack(self.applied_offset, len(self.records))]
        for entry in self.records:
            parts.append(IMAGE_RECORD.pack(entry.offset, entry.epoch, len(entry.data)))
            parts.append(entry.data)
        return b"".join(parts)

    def restore(self, image: bytes, end_offset: int) -> None:
        """Replace everything with a snapshot's image (it covers offsets below ``end_offset``)."""
        applied_offset, count = IMAGE_HEADER.unpack_from(image)
        if applied_offset != end_offset:
            raise InvariantViolation(f"a snapshot ending at {end_offset} holds an image "
                                     f"applied to {applied_offset}")
        records: list[Entry] = []
        position = IMAGE_HEADER.size
        for _ in range(count):
            offset, epoch, length = IMAGE_RECORD.unpack_from(image, position)
            position += IMAGE_RECORD.size
            records.append(Entry(offset, epoch, EntryKind.DATA, image[position:position + length]))
            position += length
        if position != len(image):
            raise InvariantViolation(f"a snapshot image of {len(image)} bytes holds {position}")
        self.applied_offset = applied_offset
        self.records = records
        self._offsets = [r.offset for r in records]
