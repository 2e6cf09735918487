"""The record of a new quorum being formatted by ``tide cluster up``: what a crash half-way
leaves, so the next ``up`` finishes the same formatting instead of stopping at it.

``local_cluster.format_new_quorum`` writes it (atomically) before formatting any controller
and removes it once every controller is formatted and a migrated metadata.log is retired:
while it exists the formatting is unfinished. It holds the initial voters (every node id
with the directory id drawn for it) and, when migrating, the SHA-256 of the metadata.log
being migrated: every controller must start from the same voters and the same snapshot.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tidewater.controller.raft import VoterKey
from tidewater.controller.raft.files import fsync_dir, write_atomically
from tidewater.proto.errors import CorruptFileError

FILE_NAME = "quorum-format.json"
VERSION = 1


@dataclass(frozen=True)
class QuorumFormatPlan:
    voters: frozenset[VoterKey]  # the initial controllers, each formatted with its own key
    metadata_log_sha256: str | None  # of the log every controller holds migrated; None: empty

    @property
    def migrating(self) -> bool:
        return self.metadata_log_sha256 is not None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_plan(path: Path) -> QuorumFormatPlan | None:
    """The unfinished formatting recorded at ``path``; None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(text)
        if doc["version"] != VERSION:
            raise ValueError(f"version {doc['version']}")
        voters = frozenset(VoterKey(int(v["id"]), str(v["directory_id"]))
                           for v in doc["voters"])
        sha = doc["metadata_log_sha256"]
        return QuorumFormatPlan(voters, None if sha is None else str(sha))
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptFileError(f"not a quorum format plan ({e})", path=str(path)) from None


def write_plan(path: Path, plan: QuorumFormatPlan) -> None:
    """Write ``plan`` durably (a crash leaves it whole or absent)."""
    doc = {"version": VERSION,
           "voters": [{"id": v.id, "directory_id": v.directory_id}
                      for v in sorted(plan.voters, key=lambda v: v.id)],
           "metadata_log_sha256": plan.metadata_log_sha256}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, (json.dumps(doc, indent=1) + "\n").encode())


def remove_plan(path: Path) -> None:
    """The formatting is finished: remove the record, durably."""
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)
