"""The controller's metadata log on the simulation's fake disk.

It stands in for ``controller.metadata_log.MetadataLog`` under the product's
``MetadataOwner``, byte for byte: records are framed with the product's
``encode_frame`` into one in-memory "file", and a new controller process reads
them back with the product's recovery (``metadata_log._decode_all``, which cuts a
torn tail). An ``append`` that returns is durable (the fsync succeeded).

A full disk (``fail_next_append``): the next append raises ``KafkaStorageError``
as the real one does, and the log refuses every later append until a new
process opens it. What reached the disk before the error is a random prefix of
the frames' bytes, anything from nothing to all of them (the write may have
landed and only the fsync failed); recovery keeps the whole frames of it. So a
restarted controller may or may not replay the records of the failed write:
either way none of them may have left the failed process.

Compaction (``rewrite``) is not simulated: the owner's ``maybe_compact`` is not
called.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Iterator

from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.metadata_log import _decode_all, encode_frame
from tidewater.proto.errors import KafkaStorageError

PATH = "sim:controller/metadata.log"


class SimMetadataLog:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.data = bytearray()  # the file: survives every controller crash
        self.start_offset = 0
        self.next_offset = 0
        self.fail_next_append = False  # the disk fills up before the next write
        self.failed_append_bytes: int | None = None  # what of it reaches the disk (None: random)
        self.failed_appends = 0
        self._recovered: list[dict] = []
        self._failure: OSError | None = None
        self.open()

    def open(self) -> None:
        """A controller process opens the file: recovery cuts a torn tail."""
        records, valid_bytes = _decode_all(bytes(self.data), PATH)
        del self.data[valid_bytes:]
        self._recovered = records
        self.next_offset = self.start_offset + len(records)
        self._failure = None

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def record_count(self) -> int:
        return self.next_offset - self.start_offset

    def recovered_records(self) -> Iterator[tuple[int, dict]]:
        records, self._recovered = self._recovered, []
        for i, record in enumerate(records):
            yield self.start_offset + i, record

    def append(self, records) -> int:
        if self._failure is not None:
            raise KafkaStorageError(f"metadata log failed earlier ({self._failure}); restart to "
                                    f"recover it", path=PATH)
        frames = b"".join(encode_frame(r) for r in records)
        first_offset = self.next_offset
        if not frames:
            return first_offset
        if self.fail_next_append:
            self.fail_next_append = False
            self.failed_appends += 1
            reached = self.failed_append_bytes
            self.failed_append_bytes = None
            self.data += frames[:self.rng.randint(0, len(frames)) if reached is None else reached]
            self._failure = OSError(errno.ENOSPC, "No space left on device")
            raise KafkaStorageError(f"cannot write metadata log: {self._failure}", path=PATH)
        self.data += frames
        self.next_offset += len(records)
        return first_offset

    def durable_image(self) -> ClusterMetadata:
        """What a controller started now would replay (the checker's view of the controller
        while none runs)."""
        image = ClusterMetadata()
        for offset, record in enumerate(_decode_all(bytes(self.data), PATH)[0]):
            image.apply(self.start_offset + offset, record)
        return image
