"""`tide dump-log` on the controller quorum's Raft files, written by the real RaftStorage."""

from __future__ import annotations

import contextlib
import io
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tidewater.controller.raft import EntryKind, RaftConfig, RaftNode, VoterKey
from tidewater.controller.raft.storage import RaftStorage
from tidewater.tools.cli import main as tide_main
from tidewater.tools.commands.dump_log import file_kind

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def tide(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``tide dump-log`` through tools.cli.main in this process."""
    argv = ["dump-log", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = tide_main(argv)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def tide_process(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidewater.tools", "dump-log", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def json_lines(result: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in result.stdout.splitlines()]

DIRECTORY_ID = "ab" * 16


def write_raft_dir(directory: Path, records: list[bytes], *, compact_after: int = 0) -> VoterKey:
    """A one-voter quorum elects itself, commits ``records`` (the first ``compact_after``
    of them then become a snapshot), all through RaftStorage as the shell does it."""
    local = RaftStorage.format(directory, 1, frozenset({VoterKey(1, DIRECTORY_ID)}),
                               directory_id=DIRECTORY_ID)
    storage = RaftStorage.open(directory)
    now_ms = 0
    node = RaftNode(RaftConfig(), local, random.Random(1), now_ms,
                    bootstrap_voters=storage.bootstrap_voters, quorum_state=storage.quorum_state)

    def drain() -> None:
        while node.has_ready():
            ready = node.ready()
            storage.carry_out(ready)
            node.advance(ready, now_ms)

    while not node.is_leader:
        now_ms += 100
        node.tick(now_ms)
        drain()
    if compact_after:
        node.propose(records[:compact_after], now_ms)
        drain()
        node.compact(b"image up to %d" % node.high_watermark, now_ms)
        drain()
    node.propose(records[compact_after:], now_ms)
    drain()
    storage.close()
    return local


def test_raft_files_are_recognised_by_name(tmp_path: Path) -> None:
    assert file_kind(tmp_path / "raft.log") == ("raft-log", None)
    assert file_kind(tmp_path / "quorum-state") == ("quorum-state", None)
    assert file_kind(tmp_path / f"snapshot-{5:020d}-{2:010d}.snap") == ("raft-snapshot", None)
    assert file_kind(tmp_path / "raft.lock") == (None, None)


def test_log_entries_with_offset_epoch_kind_and_record(tmp_path: Path) -> None:
    write_raft_dir(tmp_path, [b"alpha", b"beta"])
    result = tide("--json", "--print-data", tmp_path / "raft.log")
    assert result.returncode == 0, result.stderr
    events = json_lines(result)
    assert events[0] == {"type": "file", "file": str(tmp_path / "raft.log"), "kind": "raft-log",
                         "base_offset": None}
    header = events[1]
    assert header["type"] == "raft_log" and header["log_start_offset"] == 0
    assert header["valid_bytes"] == header["size"]
    entries = [e for e in events if e["type"] == "raft_entry"]
    # offset 0: the leader's LEADER_CHANGE of epoch 1, then the two records
    assert [(e["offset"], e["epoch"], e["kind"], e["record"]) for e in entries] == [
        (0, 1, "leader_change", None), (1, 1, "data", "alpha"), (2, 1, "data", "beta")]
    assert entries[0]["position"] == 14  # right after the 14-byte log header
    assert entries[1]["position"] == entries[0]["position"] + entries[0]["size"]


def test_records_are_hidden_without_print_data(tmp_path: Path) -> None:
    write_raft_dir(tmp_path, [b"secret"])
    text = tide(tmp_path / "raft.log").stdout
    assert "offset: 1 epoch: 1 kind: data" in text
    assert "secret" not in text
    assert "record: secret" in tide("--print-data", tmp_path / "raft.log").stdout


def test_quorum_state(tmp_path: Path) -> None:
    write_raft_dir(tmp_path, [b"x"])
    events = json_lines(tide("--json", tmp_path / "quorum-state"))
    assert events[1] == {"type": "quorum_state", "file": str(tmp_path / "quorum-state"),
                         "directory_id": DIRECTORY_ID, "epoch": 1,
                         "voted_for": f"1:{DIRECTORY_ID}", "leader_id": 1,
                         "bootstrap_voters": [f"1:{DIRECTORY_ID}"]}
    text = tide(tmp_path / "quorum-state").stdout
    assert f"epoch: 1 votedFor: 1:{DIRECTORY_ID} leaderId: 1" in text


def test_snapshot_header_voters_and_data_then_the_log_after_it(tmp_path: Path) -> None:
    write_raft_dir(tmp_path, [b"r1", b"r2", b"r3"], compact_after=2)
    # a directory stands for its files: the snapshot and the log behind it
    events = json_lines(tide("--json", "--print-data", tmp_path))
    snapshots = [e for e in events if e["type"] == "raft_snapshot"]
    assert len(snapshots) == 1
    snapshot = snapshots[0]
    # LEADER_CHANGE, r1, r2 are offsets 0..2: the snapshot ends at 3, after epoch 1
    assert (snapshot["end_offset"], snapshot["epoch"]) == (3, 1)
    assert snapshot["voters"] == [f"1:{DIRECTORY_ID}"]
    assert snapshot["data"] == "image up to 3"
    assert Path(snapshot["file"]).name == f"snapshot-{3:020d}-{1:010d}.snap"
    log = next(e for e in events if e["type"] == "raft_log")
    assert log["log_start_offset"] == 3
    assert [(e["offset"], e["record"]) for e in events if e["type"] == "raft_entry"] == [(3, "r3")]
    assert any(e["type"] == "quorum_state" for e in events)
    assert not any(e["type"] == "problem" for e in events)


def test_voters_entry_is_decoded(tmp_path: Path) -> None:
    from tidewater.controller.raft.messages import Entry, encode_voters
    from tidewater.controller.raft.storage import LOG_HEADER, LOG_MAGIC, LOG_VERSION, encode_frame
    voters = frozenset({VoterKey(1, "01" * 16), VoterKey(2, "02" * 16)})
    (tmp_path / "raft.log").write_bytes(
        LOG_HEADER.pack(LOG_MAGIC, LOG_VERSION, 0)
        + encode_frame(Entry(0, 3, EntryKind.VOTERS, encode_voters(voters))))
    entry = json_lines(tide("--json", tmp_path / "raft.log"))[2]
    assert entry["kind"] == "voters"
    assert entry["voters"] == [f"1:{'01' * 16}", f"2:{'02' * 16}"]


def test_torn_tail_is_a_problem_and_verify_fails(tmp_path: Path) -> None:
    write_raft_dir(tmp_path, [b"alpha", b"beta"])
    log_path = tmp_path / "raft.log"
    whole = log_path.read_bytes()
    log_path.write_bytes(whole[:-2])  # the last frame's data cut short
    events = json_lines(tide("--json", log_path))
    assert [e["offset"] for e in events if e["type"] == "raft_entry"] == [0, 1]
    problem = events[-1]
    assert problem["type"] == "problem" and problem["problem"] == "torn_tail"
    assert problem["position"] == len(whole) - (25 + len(b"beta"))
    assert tide("--verify", log_path).returncode == 1


def test_corruption_is_reported_with_its_position(tmp_path: Path) -> None:
    write_raft_dir(tmp_path, [b"alpha", b"beta"])
    log_path = tmp_path / "raft.log"
    data = bytearray(log_path.read_bytes())
    data[14 + 5] ^= 0xFF  # inside the first frame's header: its CRC fails
    log_path.write_bytes(bytes(data))
    result = tide("--json", log_path)
    problem = json_lines(result)[-1]
    assert problem["problem"] == "corrupt_file"
    assert "frame header CRC mismatch at byte 14" in problem["message"]

    state = tmp_path / "quorum-state"
    raw = bytearray(state.read_bytes())
    raw[30] ^= 1
    state.write_bytes(bytes(raw))
    problem = json_lines(tide("--json", state))[-1]
    assert problem["problem"] == "corrupt_file" and "CRC mismatch" in problem["message"]


def test_real_command_in_its_own_process(tmp_path: Path) -> None:
    write_raft_dir(tmp_path, [b"hello"])
    result = tide_process("--json", "--print-data", tmp_path / "raft.log")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line)["record"] for line in result.stdout.splitlines()
               if json.loads(line)["type"] == "raft_entry"]
    assert records == [None, "hello"]
