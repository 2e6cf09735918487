"""Formatting a controller's Raft directory (``controller.quorum.formatting``, KIP-853):
a wiped voter formatted again gets a new random directory id, so it cannot grant a
second vote in an epoch its old directory voted in (the audit's double vote)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from tidewater.controller.quorum.formatting import (
    UnformattedDirectoryError,
    format_raft_directory,
    is_formatted,
    require_formatted,
)
from tidewater.controller.raft import RaftConfig, RaftNode, VoterKey
from tidewater.controller.raft.messages import FetchRequest, VoteRequest, VoteResponse
from tidewater.controller.raft.storage import RaftStorage

pytestmark = pytest.mark.timeout(30)

DIR_2 = "22" * 16
DIR_3 = "33" * 16


def open_node(raft_dir: Path, node_id: int, **kwargs) -> tuple[RaftNode, RaftStorage]:
    storage = RaftStorage.open(raft_dir)
    node = RaftNode(RaftConfig(), VoterKey(node_id, storage.local_directory_id),
                    random.Random(node_id), 0, bootstrap_voters=storage.bootstrap_voters,
                    quorum_state=storage.quorum_state, snapshot=storage.snapshot,
                    entries=storage.entries, **kwargs)
    return node, storage


def vote(node: RaftNode, storage: RaftStorage, candidate: VoterKey, directory_id: str,
         epoch: int, now_ms: int) -> bool:
    """Step one VoteRequest (candidate's log far ahead) and persist; whether it was granted."""
    node.step(VoteRequest(candidate, node.local.id, directory_id, epoch, epoch, 100, False),
              now_ms)
    ready = node.ready()
    storage.carry_out(ready)
    node.advance(ready, now_ms)
    [answer] = [m for m in ready.send if isinstance(m, VoteResponse)]
    return answer.granted


def test_a_wiped_voter_formatted_again_cannot_vote_twice_in_an_epoch(tmp_path: Path) -> None:
    raft_dir = tmp_path / "raft"
    initial = frozenset({VoterKey(1, "11" * 16), VoterKey(2, DIR_2), VoterKey(3, DIR_3)})
    assert format_raft_directory(raft_dir, 1, initial) == VoterKey(1, "11" * 16)
    node, storage = open_node(raft_dir, 1)
    assert vote(node, storage, VoterKey(2, DIR_2), "11" * 16, 5, 10)  # the vote of epoch 5
    storage.close()

    shutil.rmtree(raft_dir)  # the disk is lost
    assert not is_formatted(raft_dir)
    with pytest.raises(UnformattedDirectoryError, match="not formatted.*no-initial-controllers"):
        require_formatted(raft_dir, "tide quorum format --data-dir x --node-id 1")
    for initial_controllers in (None, initial):
        # Formatted again, either way: not the old (1, directory id).
        local = format_raft_directory(raft_dir, 1, initial_controllers,
                                      fresh_directory_id=initial_controllers is not None)
        assert local.id == 1 and local.directory_id != "11" * 16
        node, storage = open_node(raft_dir, 1)
        assert not node.is_voter
        # Node 3 asks for epoch 5's vote, addressed to the old directory: refused, and
        # nothing of it reaches the disk.
        assert not vote(node, storage, VoterKey(3, DIR_3), "11" * 16, 5, 20)
        assert storage.quorum_state.voted_for is None
        storage.close()
        shutil.rmtree(raft_dir)


def test_format_once_and_an_observer_without_voters_asks_the_bootstrap_servers(
        tmp_path: Path) -> None:
    raft_dir = tmp_path / "raft"
    local = format_raft_directory(raft_dir, 4, None)
    with pytest.raises(FileExistsError):
        format_raft_directory(raft_dir, 4, None)
    node, storage = open_node(raft_dir, 4, bootstrap_servers=frozenset({1, 2, 4}))
    assert node.voters == frozenset() and not node.is_voter
    assert len(local.directory_id) == 32 and local != format_raft_directory(
        tmp_path / "other", 4, None)
    node.tick(10_000)
    ready = node.ready()
    storage.carry_out(ready)
    [fetch] = ready.send
    assert isinstance(fetch, FetchRequest) and fetch.destination in (1, 2)
    storage.close()
