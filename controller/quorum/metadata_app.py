"""The controller's metadata as the quorum's replicated application.

A committed DATA entry's bytes are one metadata record, the JSON object that
``metadata_log.encode_frame`` would frame (``{"type": ...}``); applying it is
``ClusterMetadata.apply(entry.offset, record)``, the code the single-controller
mode replays its log with. The Raft offset is the record's offset, so broker
epochs (a registration's offset) only grow, as they do in the JSON log.
LEADER_CHANGE and VOTERS entries only move ``applied_offset`` (and are shown to
``on_applied``: the owner starts deciding once its own LEADER_CHANGE is here).

Every controller, leader or standby, applies the same committed entries into
``machine.metadata``: a standby's image is hot, a failover replays nothing.

Image (a Raft snapshot's data): UTF-8 JSON
``{"applied_offset": N, "records": [record, ...]}`` where the records are
``ClusterMetadata.snapshot_records()``, which rebuild the image from nothing
(replayed at offsets 0.. as the JSON log's compaction does: every record that
carries an epoch or id carries it explicitly).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.raft import Entry, EntryKind
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.proto.errors import InvariantViolation


def encode_record(record: dict[str, object]) -> bytes:
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()


def decode_record(data: bytes, offset: int) -> dict[str, object]:
    try:
        record = json.loads(data)
    except ValueError as e:
        raise InvariantViolation(f"committed entry {offset} is not a JSON record: {e}") from e
    if not isinstance(record, dict) or "type" not in record:
        raise InvariantViolation(f"committed entry {offset} is not a metadata record")
    return record


def encode_image(applied_offset: int, metadata: ClusterMetadata) -> bytes:
    """A snapshot's image of ``metadata`` applied up to ``applied_offset`` (exclusive)."""
    return json.dumps({"applied_offset": applied_offset,
                       "records": metadata.snapshot_records()},
                      separators=(",", ":"), sort_keys=True).encode()


class MetadataApplication:
    """Applies committed entries to ``machine.metadata``; snapshots are its image."""

    def __init__(self, machine: ControllerStateMachine,
                 on_applied: Callable[[Entry], None] | None = None):
        self.machine = machine
        self.applied_offset = 0
        self.on_applied = on_applied

    @property
    def cluster_id(self) -> str:
        """The metadata's cluster id, for DescribeQuorum ("" before its first record)."""
        cluster_id: str = self.machine.metadata.cluster_id
        return cluster_id

    def apply(self, entry: Entry) -> None:
        if entry.offset < self.applied_offset:
            raise InvariantViolation(f"entry {entry.offset} applied again (applied up to "
                                     f"{self.applied_offset})")
        if entry.kind is EntryKind.DATA:
            record = decode_record(entry.data, entry.offset)
            try:
                self.machine.metadata.apply(entry.offset, record)
            except InvariantViolation:
                raise
            except Exception as e:
                # A committed record every replica must apply: this image is now in doubt.
                raise InvariantViolation(f"committed record at {entry.offset} "
                                         f"({record.get('type')}) does not apply: {e!r}") from e
        self.applied_offset = entry.offset + 1
        if self.on_applied is not None:
            self.on_applied(entry)

    def image(self) -> bytes:
        return encode_image(self.applied_offset, self.machine.metadata)

    def restore(self, image: bytes, end_offset: int) -> None:
        try:
            data = json.loads(image)
            applied_offset = int(data["applied_offset"])
            records = data["records"]
        except (ValueError, KeyError, TypeError) as e:
            raise InvariantViolation(f"a metadata snapshot image is unreadable: {e!r}") from e
        if applied_offset != end_offset:
            raise InvariantViolation(f"a snapshot ending at {end_offset} holds an image "
                                     f"applied to {applied_offset}")
        metadata = ClusterMetadata()
        for i, record in enumerate(records):
            metadata.apply(i, record)
        # The records replayed at 0..; the image stands for everything below the snapshot's
        # end (the senders compare delivered offsets with this).
        metadata.last_offset = applied_offset - 1
        self.machine.metadata = metadata
        self.applied_offset = applied_offset
