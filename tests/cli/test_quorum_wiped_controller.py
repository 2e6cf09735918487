"""Issue 26 item 3 with real processes: a controller whose data directory is wiped does
not come back as the voter it was. ``tide cluster start`` refuses it (not formatted);
``tide quorum format --no-initial-controllers`` gives it a new directory id and it runs
as an observer that grants no vote addressed to its old directory; ``tide quorum
remove-controller`` (old id + directory) then ``add-controller`` (new directory) make it
a voter again, and the quorum keeps working (a leader SIGKILLed after is replaced with
the new voter's vote, and topics are created)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest
from cluster_fixtures import describe_topic, run_tide, start_cluster, stop_cluster, wait_for
from test_quorum_tool import quorum_endpoints, status_of, voter_ids

from tidewater.controller.quorum import codec
from tidewater.controller.raft import VoterKey
from tidewater.controller.raft.messages import VoteRequest
from tidewater.controller.raft.storage import QUORUM_STATE_FILE, decode_quorum_state
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def quorum_state(raft_dir: Path):
    path = raft_dir / QUORUM_STATE_FILE
    return decode_quorum_state(path.read_bytes(), path)


def voters_of(status: dict[str, str]) -> dict[int, str]:
    return {v["id"]: v["directoryId"] for v in json.loads(status["CurrentVoters"])}


def test_wiped_controller_is_refused_then_comes_back_through_tide(tmp_path):
    c = start_cluster(tmp_path / "cluster", 1, up_flags=("--controllers", "3"))
    try:
        endpoints = quorum_endpoints(c)
        everyone = ",".join(endpoints.values())

        def caught_up():
            s = status_of(c, everyone)
            ok = s is not None and int(s["MaxFollowerLag"]) == 0 and voter_ids(s) == [1, 2, 3]
            return s if ok else None

        status = wait_for(caught_up, "3 caught-up voters", 90)
        leader = int(status["LeaderId"])
        old_dirs = voters_of(status)
        victim = next(i for i in (1, 2, 3) if i != leader)
        third = next(i for i in (1, 2, 3) if i not in (leader, victim))
        victim_dir = c.data_dir / f"controller-{victim}"
        killed = run_tide("cluster", "kill", f"controller-{victim}", "--signal", "KILL",
                          "--data-dir", str(c.data_dir))
        assert killed.returncode == 0, killed.stderr
        before = quorum_state(victim_dir / "raft")
        assert before.directory_id == old_dirs[victim]
        voted_epoch = before.state.epoch
        assert voted_epoch >= 1

        # The disk is lost: the controller refuses to start, saying how to format it.
        shutil.rmtree(victim_dir)
        refused = run_tide("cluster", "start", f"controller-{victim}",
                           "--data-dir", str(c.data_dir), timeout_s=120)
        assert refused.returncode != 0 and "exited during start-up" in refused.stderr
        said = refused.stdout + refused.stderr  # the log's tail
        assert "is not formatted" in said and "--no-initial-controllers" in said
        log = (c.data_dir / f"controller-{victim}.log").read_text()
        assert sum("is not formatted" in line for line in log.splitlines()) == 1

        formatted = run_tide("quorum", "format", "--data-dir", str(victim_dir),
                             "--node-id", str(victim), "--no-initial-controllers")
        assert formatted.returncode == 0, formatted.stderr
        new_dir = quorum_state(victim_dir / "raft").directory_id
        assert new_dir != old_dirs[victim] and new_dir in formatted.stdout
        again = run_tide("quorum", "format", "--data-dir", str(victim_dir),
                         "--node-id", str(victim), "--no-initial-controllers")
        assert again.returncode == 1 and "formatted already" in again.stderr
        started = run_tide("cluster", "start", f"controller-{victim}",
                           "--data-dir", str(c.data_dir), timeout_s=120)
        assert started.returncode == 0, started.stderr

        # An observer with its new directory id; the old one is still a voter.
        observer = wait_for(lambda: (s := status_of(c, everyone)) and json.loads(
            s["CurrentObservers"]), "the wiped controller as an observer")
        assert observer == [{"id": victim, "directoryId": new_dir}]
        assert voters_of(status_of(c, everyone) or {"CurrentVoters": "[]"})[victim] == (
            old_dirs[victim])

        # A candidate asks it for the vote of the epoch its old directory voted in, and of
        # the next: addressed to the old directory, refused; nothing is persisted.
        with grpc.insecure_channel(endpoints[victim]) as channel:
            stub = pb_grpc.ControllerQuorumStub(channel)
            for epoch in (voted_epoch, voted_epoch + 1):
                request = VoteRequest(VoterKey(third, old_dirs[third]), victim, old_dirs[victim],
                                      epoch, epoch, 1 << 40, False)
                ack = stub.RaftMessages(pb.RaftMessageBatch(
                    source_id=third, destination_id=victim,
                    messages=[codec.encode(request)]), timeout=10)
                assert ack.error_code == pb.NONE, ack.error_message
        after = quorum_state(victim_dir / "raft")
        assert after.directory_id == new_dir and after.state.voted_for is None

        # remove-controller (old directory), add-controller (new one): a voter again.
        removed = run_tide("quorum", "remove-controller", "--bootstrap-controller", everyone,
                           "--controller-id", str(victim),
                           "--controller-directory-id", old_dirs[victim])
        assert removed.returncode == 0, removed.stderr
        wait_for(lambda: (s := status_of(c, everyone)) and victim not in voters_of(s),
                 "the old directory removed")

        def added():
            result = run_tide("quorum", "add-controller", "--bootstrap-controller", everyone,
                              "--controller-id", str(victim),
                              "--controller-directory-id", new_dir)
            return result.returncode == 0 or None

        wait_for(added, "add-controller of the new directory (once caught up)", 90)
        three = wait_for(lambda: (s := status_of(c, everyone)) and voter_ids(s) == [1, 2, 3]
                         and s, "3 voters again")
        assert voters_of(three)[victim] == new_dir

        # The quorum works with it: the leader SIGKILLed, the other two elect a leader
        # (needing the new voter's vote), and metadata changes commit.
        killed = run_tide("cluster", "kill", f"controller-{leader}", "--signal", "KILL",
                          "--data-dir", str(c.data_dir))
        assert killed.returncode == 0, killed.stderr
        moved = wait_for(lambda: (s := status_of(c, everyone)) and int(s["LeaderId"]) != leader
                         and s, "a new leader", 60)
        assert int(moved["LeaderEpoch"]) > int(status["LeaderEpoch"])
        wait_for(lambda: c.tide("topics", "create", "after-wipe", "--partitions", "1",
                                "--replication-factor", "1").returncode == 0 or None,
                 "a topic created with the new leader", 60)
        assert describe_topic(c, "after-wipe") is not None
    finally:
        stop_cluster(c)
