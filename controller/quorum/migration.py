"""Moving a single controller's JSON metadata log into a quorum, once.

A controller run without ``controller.quorum.voters`` keeps its metadata in
``<data-dir>/metadata.log`` (``metadata_log``); a quorum keeps it in Raft
(``<data-dir>/raft``). Started as a quorum on a directory whose metadata.log
was never migrated, a controller would open an empty Raft log and every topic
would be gone: it refuses instead (``require_migrated``), naming the command
that migrates.

``tide quorum format ... --initial-controllers L --migrate-metadata-log PATH``
(and ``python -m tidewater.controller.quorum format``, both through
``format_controller``) formats the Raft directory holding one snapshot
(``metadata_app``'s image):

- the image is the log replayed into ``ClusterMetadata`` at its own offsets, the
  replay a single controller's start does (``MetadataOwner.recover``);
- the snapshot ends at the log's next offset (its record count, plus what a
  compaction cut: offsets only grow), so broker epochs, which are registration
  offsets, keep growing in the quorum;
- its epoch is ``MIGRATION_EPOCH`` (1) and its voters the ``--initial-controllers``.

Every controller of the list is formatted this way, from the same file (copy it
to the other machines; the renamed ``metadata.log.migrated`` is read as well).
Why all of them: a vote compares logs' (last epoch, end offset), and two of three
controllers with empty logs are a majority that could elect a leader without the
metadata, whose log would then replace it. With the same snapshot everywhere
every log is equally up to date and any leader has all of it (as Kafka formats
every controller with the same bootstrap checkpoint). The replay is
deterministic, so the images are the same bytes.

Afterwards the controller's own ``metadata.log`` (``PATH`` when it is
``<data-dir>/metadata.log``) is renamed ``metadata.log.migrated``: the refusal
does not fire again and the data cannot be migrated twice into one directory.
A crash between formatting and the rename leaves both; the refusal lets such a
directory start (its Raft directory holds a snapshot).
"""

from __future__ import annotations

import os
from pathlib import Path

from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.metadata_log import FILE_NAME, lock_directory, read_records
from tidewater.controller.quorum.formatting import format_raft_directory, raft_directory
from tidewater.controller.quorum.metadata_app import encode_image
from tidewater.controller.raft import Snapshot, SnapshotId, VoterKey
from tidewater.controller.raft.files import fsync_dir
from tidewater.proto.errors import InvalidConfigError

MIGRATED_SUFFIX = ".migrated"
# The epoch of the migrated snapshot: above the 0 of a directory formatted empty, so a
# formatted-empty controller's log never counts as up to date as a migrated one's.
MIGRATION_EPOCH = 1


class UnmigratedMetadataLogError(InvalidConfigError):
    """A quorum controller's data directory holds a metadata.log never migrated."""


class NothingToMigrateError(InvalidConfigError):
    """``--migrate-metadata-log`` names a file that is missing or holds no record."""


def holds_snapshot(raft_dir: Path) -> bool:
    return any(Path(raft_dir).glob("snapshot-*.snap"))


def require_migrated(data_dir: Path, migrate_command: str) -> None:
    """Raise ``UnmigratedMetadataLogError`` (one line) when ``data_dir`` holds a non-empty
    metadata.log and its Raft directory no migrated snapshot. ``migrate_command`` is the
    format command as the user runs it for this controller."""
    log_path = Path(data_dir) / FILE_NAME
    if not has_records(log_path) or holds_snapshot(raft_directory(data_dir)):
        return
    raise UnmigratedMetadataLogError(
        f"{log_path} holds the metadata of a single-controller cluster "
        f"and the quorum's Raft directory does not: started as a quorum it would lose "
        f"every topic. Migrate it once: stop, move {raft_directory(data_dir)} away if it "
        f"was formatted, run `{migrate_command} --initial-controllers "
        f"ID@HOST:PORT:DIRECTORY_ID,... --migrate-metadata-log {log_path}`, and format the "
        f"other controllers with the same options on a copy of the file")


def migrated_snapshot(log_path: Path,
                      voters: frozenset[VoterKey]) -> Snapshot:
    """The metadata log at ``log_path`` as a Raft snapshot for the quorum ``voters``."""
    try:
        start_offset, records = read_records(log_path)
    except FileNotFoundError:
        raise NothingToMigrateError(f"{log_path} does not exist") from None
    if not records:
        raise NothingToMigrateError(f"{log_path} holds no metadata record")
    metadata = ClusterMetadata()
    for i, record in enumerate(records):
        metadata.apply(start_offset + i, record)
    end_offset = start_offset + len(records)
    return Snapshot(SnapshotId(end_offset, MIGRATION_EPOCH), voters,
                    encode_image(end_offset, metadata))


def migrate_metadata_log(raft_dir: Path, node_id: int, initial_controllers: frozenset[VoterKey],
                         log_path: Path, *, fresh_directory_id: bool = False
                         ) -> tuple[VoterKey, Snapshot]:
    """Format ``raft_dir`` holding ``log_path`` migrated, then rename the log when it is
    this controller's own (``metadata.log`` beside ``raft_dir``, which is
    ``<data-dir>/raft``). Raises ``FileExistsError`` when formatted already."""
    raft_dir = Path(raft_dir)
    log_path = Path(log_path)
    own_log = raft_dir.parent / FILE_NAME
    is_own = log_path.name == FILE_NAME and log_path.resolve() == own_log.resolve()
    lock_file = None
    if log_path.name == FILE_NAME and log_path.parent.is_dir():
        # The controller that writes this log must be stopped: hold its lock meanwhile.
        lock_file = lock_directory(
            log_path.parent, "metadata log is locked by a running controller: stop it first")
    try:
        snapshot = migrated_snapshot(log_path, initial_controllers)
        local = format_raft_directory(raft_dir, node_id, initial_controllers,
                                      fresh_directory_id=fresh_directory_id, snapshot=snapshot)
        if is_own:
            retire_metadata_log(own_log)
    finally:
        if lock_file is not None:
            lock_file.close()
    return local, snapshot


def retire_metadata_log(log_path: Path) -> Path:
    """Rename a migrated ``metadata.log`` to ``metadata.log.migrated``, durably: no
    controller replays it again, no migration reads it twice by its old name."""
    retired = log_path.with_name(log_path.name + MIGRATED_SUFFIX)
    os.rename(log_path, retired)
    fsync_dir(log_path.parent)
    return retired


def has_records(log_path: Path) -> bool:
    """``log_path`` exists and is not empty (a single controller's metadata to migrate)."""
    try:
        return Path(log_path).stat().st_size > 0
    except FileNotFoundError:
        return False
