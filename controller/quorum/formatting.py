"""Formatting a controller's Raft directory: Kafka's ``kafka-storage format`` (KIP-853).

A directory is formatted once, explicitly, before the first start; a controller
never formats its own directory behind the operator's back. Why: a voter is
(node id, directory id), and what makes a vote safe is that the directory that
cast it remembers it. A wiped directory formatted again under the old directory
id would be the same voter with no memory of its vote, and could grant a second
candidate in an epoch it already voted in (two leaders in one epoch). So:

- ``--initial-controllers ID@HOST:PORT:DIRID,...`` (a new cluster): the bootstrap
  voter set is written with the directory; the node takes the directory id the
  list names for it (each was drawn at random when the list was made,
  ``new_directory_id``), or a new random one with ``new_directory_id=True``.
- ``--no-initial-controllers`` (a controller added later, or a wiped one
  brought back): a new random directory id and no voter set. The node runs as an
  observer: it fetches the log (asking the controllers it is configured with who
  leads) but never votes, until ``tide quorum add-controller`` adds it; a wiped
  voter's old (id, directory id) is removed with ``remove-controller``.

A controller started on a directory never formatted refuses to start
(``UnformattedDirectoryError``), unless told ``--format-if-empty`` (containers,
as Kafka's docker image formats an empty volume at first start: there a wiped
volume does come back as the old voter, which the operator must avoid).

One implementation, used by ``python -m tidewater.controller.quorum format``,
``tide quorum format``, ``tide-controller --format-if-empty`` and ``tide cluster up``.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from tidewater.controller.raft import Snapshot, VoterKey
from tidewater.controller.raft.storage import QUORUM_STATE_FILE, RaftStorage
from tidewater.proto.errors import InvalidConfigError


class UnformattedDirectoryError(InvalidConfigError):
    """A controller's Raft directory was never formatted (new, or wiped)."""


def new_directory_id() -> str:
    """A random directory id (Kafka's ``kafka-storage random-uuid``)."""
    return uuid.uuid4().hex


def raft_directory(data_dir: Path) -> Path:
    """Where a controller started with ``--data-dir data_dir`` keeps its Raft files."""
    return Path(data_dir) / "raft"


def is_formatted(raft_dir: Path) -> bool:
    return (raft_dir / QUORUM_STATE_FILE).exists()


def format_raft_directory(raft_dir: Path, node_id: int,
                          initial_controllers: frozenset[VoterKey] | None, *,
                          fresh_directory_id: bool = False,
                          snapshot: Snapshot | None = None) -> VoterKey:
    """Format ``raft_dir`` for node ``node_id``; the (id, directory id) it votes as.

    ``initial_controllers`` None is ``--no-initial-controllers`` (an observer with a new
    directory id). ``snapshot``: the directory starts with it (``migration``). Raises
    ``FileExistsError`` when the directory is formatted already."""
    if initial_controllers is None:
        return RaftStorage.format(raft_dir, node_id, frozenset(),
                                  directory_id=new_directory_id(), snapshot=snapshot)
    own = [v for v in initial_controllers if v.id == node_id]
    if fresh_directory_id or not own:
        directory_id = new_directory_id()
    else:
        directory_id = own[0].directory_id
    return RaftStorage.format(raft_dir, node_id, initial_controllers, directory_id=directory_id,
                              snapshot=snapshot)


def require_formatted(raft_dir: Path, format_command: str) -> None:
    """Raise ``UnformattedDirectoryError`` (one line: what to do) if ``raft_dir`` is not
    formatted; ``format_command`` is the command that formats it, as the user runs it."""
    if not is_formatted(raft_dir):
        raise UnformattedDirectoryError(
            f"{raft_dir} is not formatted: run `{format_command} --initial-controllers "
            f"ID@HOST:PORT:DIRECTORY_ID,...` for a new cluster, or `{format_command} "
            f"--no-initial-controllers` to join as an observer, then `tide quorum "
            f"add-controller` (a wiped controller never rejoins as the voter it was)")
