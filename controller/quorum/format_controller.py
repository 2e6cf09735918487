"""Formatting one controller's Raft directory: migrate a metadata.log into it, or format it empty.

The one dispatch behind ``tide quorum format``, ``python -m tidewater.controller.quorum
format`` and ``tide cluster up`` (``format_new_quorum``); each keeps only its own
arguments, messages and exit codes. The rule: with ``migrate_from`` the directory starts
holding that log as a snapshot (``migration.migrate_metadata_log``), which needs the
initial controllers (every controller of the list is formatted with the same snapshot);
without it the directory is formatted empty (``formatting.format_raft_directory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tidewater.controller.quorum.formatting import format_raft_directory
from tidewater.controller.quorum.migration import migrate_metadata_log
from tidewater.controller.raft import Snapshot, VoterKey
from tidewater.proto.errors import InvalidConfigError


class MigrationNeedsVotersError(InvalidConfigError):
    """A migration asked for without initial controllers (``--no-initial-controllers``)."""


@dataclass(frozen=True)
class FormatResult:
    local: VoterKey  # the (node id, directory id) this controller votes as
    snapshot: Snapshot | None  # the migrated metadata, None when formatted empty


def format_controller(raft_dir: Path, node_id: int, voters: frozenset[VoterKey] | None, *,
                      migrate_from: Path | None = None,
                      fresh_directory_id: bool = False) -> FormatResult:
    """Format ``raft_dir`` for node ``node_id`` with the initial controllers ``voters``
    (None: none, an observer), holding ``migrate_from`` migrated when given.

    Raises ``MigrationNeedsVotersError`` for a migration without ``voters``, what
    ``migrate_metadata_log`` raises (``NothingToMigrateError``, a running controller's
    locked log, a corrupt log) and ``FileExistsError`` when formatted already."""
    if migrate_from is None:
        return FormatResult(format_raft_directory(raft_dir, node_id, voters,
                                                  fresh_directory_id=fresh_directory_id), None)
    if voters is None:
        raise MigrationNeedsVotersError(
            "--migrate-metadata-log needs --initial-controllers (every controller is "
            "formatted with the migrated metadata)")
    local, snapshot = migrate_metadata_log(raft_dir, node_id, voters, migrate_from,
                                           fresh_directory_id=fresh_directory_id)
    return FormatResult(local, snapshot)
