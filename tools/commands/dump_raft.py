"""``tide dump-log`` for the controller quorum's Raft files (``controller/raft/storage.py``).

=============================  ==================================================
``raft.log``                   one line per entry: offset, epoch, kind, record
``quorum-state``               epoch, vote, leader, directory id, bootstrap voters
``snapshot-<end>-<epoch>.snap`` the snapshot's header, its voters, its image
=============================  ==================================================

``--json`` objects (stable, as dump_log's)::

    {"type": "raft_log", "file", "log_start_offset", "valid_bytes", "size"}
    {"type": "raft_entry", "file", "position", "offset", "epoch", "kind", "size",
     "record", "voters"}
    {"type": "quorum_state", "file", "directory_id", "epoch", "voted_for", "leader_id",
     "bootstrap_voters"}
    {"type": "raft_snapshot", "file", "end_offset", "epoch", "voters", "size", "data"}

``kind`` is the ``EntryKind`` name (data, leader_change, voters); ``record`` is a
DATA entry's bytes as UTF-8 text (others backslash-escaped), printed with
``--print-data`` only (null otherwise and for other kinds); ``voters`` is a
VOTERS entry's set as ``["id:directory_id", ...]`` (null for other kinds).
``voted_for`` is ``"id:directory_id"`` or null. A snapshot's ``data`` (the
application's image, opaque to Raft) is printed with ``--print-data`` only.

A torn tail of ``raft.log`` (what a crash during an append leaves, and what the
next open cuts) is a ``torn_tail`` problem at its byte position; damage no crash
explains is a ``corrupt_file`` problem (the reader is the storage's own:
``storage.read_log``, ``decode_quorum_state``, ``snapshot_file.decode``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tidewater.controller.raft import snapshot_file
from tidewater.controller.raft.messages import EntryKind, VoterKey, decode_voters
from tidewater.controller.raft.storage import (
    FRAME_HEADER,
    LOG_FILE,
    QUORUM_STATE_FILE,
    decode_quorum_state,
    read_log,
)

Event = dict[str, Any]

KIND_RAFT_LOG = "raft-log"
KIND_QUORUM_STATE = "quorum-state"
KIND_RAFT_SNAPSHOT = "raft-snapshot"


def raft_file_kind(path: Path) -> str | None:
    if path.name == LOG_FILE:
        return KIND_RAFT_LOG
    if path.name == QUORUM_STATE_FILE:
        return KIND_QUORUM_STATE
    if snapshot_file.NAME.match(path.name):
        return KIND_RAFT_SNAPSHOT
    return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def _voter(key: VoterKey) -> str:
    return f"{key.id}:{key.directory_id}"


def _voters(voters: frozenset[VoterKey]) -> list[str]:
    return [_voter(v) for v in sorted(voters)]


def dump_raft_file(path: Path, kind: str, *, print_data: bool) -> Iterator[Event]:
    """Events for one Raft file; raises ``CorruptRaftFileError`` / ``OSError``."""
    file = str(path)
    data = path.read_bytes()
    if kind == KIND_RAFT_LOG:
        log = read_log(data, path)
        yield {"type": "raft_log", "file": file, "log_start_offset": log.log_start_offset,
               "valid_bytes": log.valid_bytes, "size": len(data)}
        for entry, position in zip(log.entries, log.positions, strict=True):
            yield {"type": "raft_entry", "file": file, "position": position,
                   "offset": entry.offset, "epoch": entry.epoch, "kind": entry.kind.name.lower(),
                   "size": FRAME_HEADER.size + len(entry.data),
                   "record": _text(entry.data) if print_data and entry.kind is EntryKind.DATA
                   else None,
                   "voters": _voters(decode_voters(entry.data))
                   if entry.kind is EntryKind.VOTERS else None}
        if log.valid_bytes < len(data):
            yield {"type": "problem", "file": file, "position": log.valid_bytes,
                   "problem": "torn_tail",
                   "message": f"{len(data) - log.valid_bytes} bytes after the last whole "
                              f"entry (a crash during an append; cut at the next open)"}
    elif kind == KIND_QUORUM_STATE:
        content = decode_quorum_state(data, path)
        state = content.state
        yield {"type": "quorum_state", "file": file, "directory_id": content.directory_id,
               "epoch": state.epoch,
               "voted_for": _voter(state.voted_for) if state.voted_for else None,
               "leader_id": state.leader_id,
               "bootstrap_voters": _voters(content.bootstrap_voters)}
    elif kind == KIND_RAFT_SNAPSHOT:
        snapshot = snapshot_file.decode(data, path)
        yield {"type": "raft_snapshot", "file": file,
               "end_offset": snapshot.snapshot_id.offset, "epoch": snapshot.snapshot_id.epoch,
               "voters": _voters(snapshot.voters), "size": len(snapshot.data),
               "data": _text(snapshot.data) if print_data else None}
    else:
        raise ValueError(f"not a raft file kind: {kind}")


def format_raft_text(event: Event) -> str | None:
    """The text line of a Raft event, None for another event type."""
    kind = event["type"]
    if kind == "raft_log":
        return (f"Raft log starting offset: {event['log_start_offset']} "
                f"validBytes: {event['valid_bytes']} size: {event['size']}")
    if kind == "raft_entry":
        line = (f"offset: {event['offset']} epoch: {event['epoch']} kind: {event['kind']} "
                f"position: {event['position']} size: {event['size']}")
        if event["voters"] is not None:
            line += f" voters: [{', '.join(event['voters'])}]"
        if event["record"] is not None:
            line += f" record: {event['record']}"
        return line
    if kind == "quorum_state":
        voted = event["voted_for"] or "none"
        leader = "none" if event["leader_id"] is None else event["leader_id"]
        return (f"directoryId: {event['directory_id']} epoch: {event['epoch']} "
                f"votedFor: {voted} leaderId: {leader} "
                f"bootstrapVoters: [{', '.join(event['bootstrap_voters'])}]")
    if kind == "raft_snapshot":
        line = (f"snapshot endOffset: {event['end_offset']} epoch: {event['epoch']} "
                f"voters: [{', '.join(event['voters'])}] dataSize: {event['size']}")
        if event["data"] is not None:
            line += f"\n| data: {event['data']}"
        return line
    return None
