"""Data-driven tests of the Raft core, as etcd-io/raft's ``testdata/*.txt``: each file in
``raft_testdata/`` is commands, each followed by ``----`` and the trace it must produce.

Commands (node keys are ``<id>/<id repeated 32 times>``, e.g. voter 2 is ``2/222...``):

    node <id> [log=<epoch>,...] [state=<epoch>/<voted id or ->/<leader id or ->] [dir=<hex char>]
    tick <id> <now_ms>
    vote <to> from=<id> epoch=<n> last=<epoch> end=<offset> [pre] [dir=<hex char>]
    vote-answer <to> from=<id> epoch=<n> candidate=<n> [pre] [granted] [leader=<id>]
    fetch <to> from=<id> epoch=<n> offset=<n> last=<epoch> [id=<correlation>]
    propose <id> <record> ...
    ready <id>            # prints the Ready (then advances), and the node's role

``REWRITE=1`` rewrites the expected traces (then read the diff before committing).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tidewater.controller.raft import QuorumState, RaftConfig, RaftNode, Ready, VoterKey
from tidewater.controller.raft.messages import (
    Entry,
    EntryKind,
    FetchRequest,
    FetchResponse,
    Message,
    VoteRequest,
    VoteResponse,
)

pytestmark = pytest.mark.timeout(60)

TESTDATA = Path(__file__).parent / "raft_testdata"
VOTER_IDS = (1, 2, 3)


def key(node_id: int, directory: str | None = None) -> VoterKey:
    return VoterKey(node_id, (directory or str(node_id)) * 32)


def render_message(message: Message) -> str:
    to = f"-> {message.destination}"
    if isinstance(message, VoteRequest):
        kind = "pre-vote" if message.pre_vote else "vote"
        return (f"{to} {kind} epoch={message.candidate_epoch} last={message.last_epoch} "
                f"end={message.log_end_offset}")
    if isinstance(message, VoteResponse):
        kind = "pre-vote-answer" if message.pre_vote else "vote-answer"
        leader = "-" if message.leader_id is None else message.leader_id
        return (f"{to} {kind} epoch={message.epoch} candidate={message.candidate_epoch} "
                f"granted={message.granted} leader={leader}")
    if isinstance(message, FetchRequest):
        return (f"{to} fetch epoch={message.epoch} offset={message.fetch_offset} "
                f"last={message.last_fetched_epoch}")
    if isinstance(message, FetchResponse):
        parts = [f"{to} fetch-answer epoch={message.epoch} {message.error.value} "
                 f"hw={message.high_watermark}"]
        if message.entries:
            parts.append("entries=" + ",".join(f"{e.offset}@{e.epoch}" for e in message.entries))
        if message.diverging:
            parts.append(f"diverging={message.diverging.offset}@{message.diverging.epoch}")
        if message.snapshot_id:
            parts.append(f"snapshot={message.snapshot_id.offset}@{message.snapshot_id.epoch}")
        return " ".join(parts)
    return f"{to} {type(message).__name__} epoch={getattr(message, 'epoch', '?')}"


def render_entry(entry: Entry) -> str:
    kind = {EntryKind.DATA: entry.data.decode(), EntryKind.LEADER_CHANGE: "leader-change",
            EntryKind.VOTERS: "voters"}[entry.kind]
    return f"{entry.offset}@{entry.epoch}:{kind}"


def render_ready(ready: Ready, node: RaftNode) -> list[str]:
    lines = []
    if ready.log_truncate_to is not None:
        lines.append(f"truncate to {ready.log_truncate_to}")
    if ready.log_append:
        lines.append("append " + " ".join(render_entry(e) for e in ready.log_append))
    if ready.quorum_state is not None:
        state = ready.quorum_state
        voted = "-" if state.voted_for is None else state.voted_for.id
        leader = "-" if state.leader_id is None else state.leader_id
        lines.append(f"persist epoch={state.epoch} voted={voted} leader={leader}")
    lines += [render_message(m) for m in sorted(ready.send, key=lambda m: m.destination)]
    if ready.committed:
        lines.append("commit " + " ".join(render_entry(e) for e in ready.committed))
    lines.append(f"role {node.role.value} epoch={node.epoch} hw={node.high_watermark}")
    return lines


class Script:
    def __init__(self) -> None:
        self.nodes: dict[int, RaftNode] = {}
        self.voters = frozenset(key(i) for i in VOTER_IDS)

    def run(self, command: str) -> list[str]:
        words = command.split()
        verb, args = words[0], words[1:]
        flags = {a for a in args if "=" not in a}
        named = dict(a.split("=", 1) for a in args if "=" in a)
        if verb == "node":
            node_id = int(args[0])
            epochs = [int(e) for e in named["log"].split(",")] if "log" in named else []
            entries = [Entry(o, e, EntryKind.DATA, f"r{o}".encode()) for o, e in enumerate(epochs)]
            state = QuorumState()
            if "state" in named:
                epoch, voted, leader = named["state"].split("/")
                state = QuorumState(int(epoch), None if voted == "-" else key(int(voted)),
                                    None if leader == "-" else int(leader))
            self.nodes[node_id] = RaftNode(
                RaftConfig(), key(node_id, named.get("dir")), random.Random(node_id), 0,
                bootstrap_voters=self.voters, quorum_state=state, entries=entries)
            return []
        node = self.nodes[int(args[0])]
        if verb == "tick":
            node.tick(int(args[1]))
        elif verb == "vote":
            node.step(VoteRequest(key(int(named["from"])), node.local.id,
                                  key(node.local.id, named.get("dir")).directory_id,
                                  int(named["epoch"]), int(named["last"]), int(named["end"]),
                                  "pre" in flags), 0)
        elif verb == "vote-answer":
            leader = int(named["leader"]) if "leader" in named else None
            node.step(VoteResponse(key(int(named["from"])), node.local.id, int(named["epoch"]),
                                   leader, int(named["candidate"]), "pre" in flags,
                                   "granted" in flags), 0)
        elif verb == "fetch":
            node.step(FetchRequest(key(int(named["from"])), node.local.id, int(named["epoch"]),
                                   int(named["offset"]), int(named["last"]),
                                   int(named.get("id", 1))), 0)
        elif verb == "propose":
            node.propose([a.encode() for a in args[1:]], 0)
        elif verb == "ready":
            ready = node.ready()
            node.advance(ready, 0)
            return render_ready(ready, node)
        else:
            raise ValueError(f"unknown command {verb!r}")
        return []


def run_file(path: Path) -> tuple[str, str]:
    """The file's text, and the text it should have (traces recomputed)."""
    text = path.read_text()
    script = Script()
    out: list[str] = []
    blocks = text.split("\n\n")
    for block in blocks:
        lines = block.strip("\n").splitlines()
        if not lines:
            continue
        commands = [line for line in lines[:lines.index("----")]] if "----" in lines else lines
        trace: list[str] = []
        for command in commands:
            if command and not command.startswith("#"):
                trace += script.run(command)
        out.append("\n".join([*commands, "----", *trace]))
    return text, "\n\n".join(out) + "\n"


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.stem)
def test_script(path):
    text, expected = run_file(path)
    if os.environ.get("REWRITE"):
        path.write_text(expected)
        return
    assert text == expected


def test_there_are_scripts():
    assert len(list(TESTDATA.glob("*.txt"))) >= 3
