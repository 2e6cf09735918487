"""Issue 26: ``tide quorum`` (kafka-metadata-quorum.sh) against a ``tide cluster up
--controllers 3`` quorum: describe --status / --replication name the leader, the voters
and their lag; remove-controller then add-controller change the voter set; after a
SIGKILL of the leader the new leader shows."""

from __future__ import annotations

import json
import re
import socket
import struct
import uuid

import pytest
from cluster_fixtures import (
    RunningCluster,
    assert_one_line_error,
    run_tide,
    start_cluster,
    stop_cluster,
    wait_for,
)

from tidewater.broker.kafka import codec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DESCRIBE_QUORUM = 55
METADATA_PARTITION = {"topics": [{"topic_name": "__cluster_metadata",
                                  "partitions": [{"partition_index": 0}]}]}


def describe_quorum_wire(kafka: str, version: int, values: dict = METADATA_PARTITION):
    """A raw DescribeQuorum request to a broker's Kafka listener; the decoded answer."""
    host, _, port = kafka.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(codec.encode_request(DESCRIBE_QUORUM, version, 7, values))
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = codec.decode_response(DESCRIBE_QUORUM, version,
                                          s.recv(size, socket.MSG_WAITALL))
    return answer


def check_wire_matches(c: RunningCluster, status: dict[str, str], dead: int = -1) -> None:
    """Every broker's Kafka listener answers DescribeQuorum v0-2 with the leader, epoch
    and voters ``describe --status`` shows (``dead``: a killed voter, fetching nothing)."""
    voters = json.loads(status["CurrentVoters"])
    for kafka in c.manifest()["kafka_bootstrap"].split(","):
        for version in (0, 1, 2):
            answer = describe_quorum_wire(kafka, version)
            assert answer.error_code == 0
            [topic] = answer.topics
            assert topic.topic_name == "__cluster_metadata"
            [partition] = topic.partitions
            assert partition.error_code == 0
            assert partition.leader_id == int(status["LeaderId"])
            assert partition.leader_epoch == int(status["LeaderEpoch"])
            assert partition.high_watermark >= int(status["HighWatermark"])
            assert sorted(v.replica_id for v in partition.current_voters) == sorted(
                v["id"] for v in voters)
            live = [v for v in partition.current_voters if v.replica_id != dead]
            assert all(v.log_end_offset > 0 for v in live)
            if version >= 1:
                assert all(v.last_fetch_timestamp > 0 and v.last_caught_up_timestamp > 0
                           for v in live)
            if version >= 2:
                assert sorted((v.replica_id, v.replica_directory_id.hex)
                              for v in partition.current_voters) == sorted(
                    (v["id"], v["directoryId"]) for v in voters)
                assert sorted(n.node_id for n in answer.nodes) == [1, 2, 3]
                assert all(n.listeners[0].name == "CONTROLLER" for n in answer.nodes)


def quorum_endpoints(c: RunningCluster) -> dict[int, str]:
    """node id -> its quorum endpoint, from the controllers' controller.quorum.voters."""
    for proc in c.manifest()["processes"].values():
        for arg in proc["command"]:
            if arg.startswith("controller.quorum.voters="):
                voters = arg.partition("=")[2].split(",")
                return {int(v.partition("@")[0]): v.partition("@")[2] for v in voters}
    raise AssertionError("no controller.quorum.voters in the manifest")


def status_of(c: RunningCluster, controllers: str | None) -> dict[str, str] | None:
    """``describe --status`` from the controllers, or (None) through a broker."""
    result = (run_tide("quorum", "describe", "--status", "--bootstrap-controller", controllers)
              if controllers is not None else c.tide("quorum", "describe", "--status"))
    if result.returncode != 0:
        return None
    fields = {}
    for line in result.stdout.splitlines():
        name, sep, value = line.partition(":")
        assert sep, line
        fields[name] = value.strip()
    return fields


def replication_of(controllers: str) -> list[dict[str, str]] | None:
    result = run_tide("quorum", "describe", "--replication", "--bootstrap-controller", controllers)
    if result.returncode != 0:
        return None
    header, *rows = [re.split(r"\s+", line.strip()) for line in result.stdout.splitlines()]
    assert header == ["NodeId", "DirectoryId", "LogEndOffset", "Lag", "LastFetchTimestamp",
                      "LastCaughtUpTimestamp", "Status"]
    return [dict(zip(header, row, strict=True)) for row in rows]


def voter_ids(status: dict[str, str]) -> list[int]:
    return sorted(v["id"] for v in json.loads(status["CurrentVoters"]))


def test_quorum_describe_change_voters_and_failover(tmp_path):
    c = start_cluster(tmp_path / "cluster", 3, "min.insync.replicas=2",
                      up_flags=("--controllers", "3"))
    try:
        endpoints = quorum_endpoints(c)
        everyone = ",".join(endpoints.values())

        def three_voters_caught_up():
            status = status_of(c, everyone)
            if status is None or status["ClusterId"] == "" or int(status["MaxFollowerLag"]) != 0:
                return None
            return status if voter_ids(status) == [1, 2, 3] else None

        status = wait_for(three_voters_caught_up, "a leader with 3 caught-up voters", 90)
        leader = int(status["LeaderId"])
        assert leader in endpoints
        epoch = int(status["LeaderEpoch"])
        assert epoch > 0 and int(status["HighWatermark"]) > 0
        assert int(status["MaxFollowerLagTimeMs"]) >= 0
        assert json.loads(status["CurrentObservers"]) == []
        # The cluster id is the metadata's, as the brokers report it.
        described = c.tide("cluster", "describe", "--json")
        assert described.returncode == 0, described.stderr
        assert json.loads(described.stdout)["cluster_id"] == status["ClusterId"]

        # A follower's endpoint alone does not lead: a typed one-line error naming the leader.
        follower = next(i for i in endpoints if i != leader)
        refused = run_tide("quorum", "describe", "--status",
                           "--bootstrap-controller", endpoints[follower])
        assert_one_line_error(refused, "NOT_CONTROLLER", f"the leader is node {leader}")

        rows = wait_for(lambda: replication_of(everyone), "describe --replication")
        assert [r["NodeId"] for r in rows][0] == str(leader)
        assert sorted(int(r["NodeId"]) for r in rows) == [1, 2, 3]
        assert {r["Status"] for r in rows} == {"Leader", "Follower"}
        for row in rows:
            assert int(row["Lag"]) >= 0 and int(row["LogEndOffset"]) > 0
            assert int(row["LastFetchTimestamp"]) > 0 and int(row["LastCaughtUpTimestamp"]) > 0
            assert re.fullmatch(r"[0-9a-f]{32}", row["DirectoryId"])

        # The same through every broker's Kafka listener (forwarded to the quorum leader).
        check_wire_matches(c, wait_for(three_voters_caught_up, "the quorum, again"))
        through_broker = status_of(c, None)
        assert through_broker is not None
        now = status_of(c, everyone)
        assert now is not None
        for field in ("ClusterId", "LeaderId", "LeaderEpoch", "CurrentVoters"):
            assert through_broker[field] == now[field], field
        other = describe_quorum_wire(c.manifest()["kafka_bootstrap"].split(",")[0], 2,
                                     {"topics": [{"topic_name": "orders",
                                                  "partitions": [{"partition_index": 0}]}]})
        assert other.error_code == 0
        assert other.topics[0].partitions[0].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION

        # remove-controller, then add-controller of the standby it leaves.
        victim = next(r for r in rows if r["Status"] == "Follower")
        victim_id, victim_dir = victim["NodeId"], victim["DirectoryId"]
        removed = run_tide("quorum", "remove-controller", "--bootstrap-controller", everyone,
                           "--controller-id", victim_id, "--controller-directory-id", victim_dir)
        assert removed.returncode == 0, removed.stderr
        two = wait_for(lambda: (s := status_of(c, everyone)) and len(voter_ids(s)) == 2 and s,
                       "2 voters")
        assert int(victim_id) not in voter_ids(two)
        # The removed controller still runs: an observer of the quorum.
        observer = wait_for(lambda: (s := status_of(c, everyone)) and json.loads(
            s["CurrentObservers"]), "the removed controller as an observer")
        assert observer == [{"id": int(victim_id), "directoryId": victim_dir}]
        rows = replication_of(everyone)
        assert rows is not None and {r["NodeId"]: r["Status"] for r in rows}[victim_id] == "Observer"
        added = run_tide("quorum", "add-controller", "--bootstrap-controller", everyone,
                         "--controller-id", victim_id, "--controller-directory-id", victim_dir)
        assert added.returncode == 0, added.stderr
        three = wait_for(lambda: (s := status_of(c, everyone)) and len(voter_ids(s)) == 3 and s,
                         "3 voters again")
        assert voter_ids(three) == [1, 2, 3]
        bad = run_tide("quorum", "add-controller", "--bootstrap-controller", everyone,
                       "--controller-id", victim_id, "--controller-directory-id", "nothex")
        assert_one_line_error(bad, "--controller-directory-id")
        assert bad.returncode == 2

        # SIGKILL the leader: the new one shows, in a later epoch.
        now = status_of(c, everyone)
        assert now is not None
        leader, epoch = int(now["LeaderId"]), int(now["LeaderEpoch"])
        killed = c.tide("cluster", "kill", f"controller-{leader}", "--signal", "KILL",
                        "--data-dir", str(c.data_dir))
        assert killed.returncode == 0, killed.stderr

        def new_leader():
            s = status_of(c, everyone)
            return s if s is not None and int(s["LeaderId"]) != leader else None

        moved = wait_for(new_leader, "a new quorum leader", 60)
        assert int(moved["LeaderEpoch"]) > epoch
        assert voter_ids(moved) == [1, 2, 3]
        rows = replication_of(everyone)
        assert rows is not None and rows[0]["NodeId"] == moved["LeaderId"]
        # Brokers follow the new leader too.
        def live_fetching():
            rows = replication_of(everyone)
            return rows is not None and all(
                int(r["LogEndOffset"]) > 0 and int(r["LastFetchTimestamp"]) > 0
                for r in rows if r["NodeId"] != str(leader))

        wait_for(live_fetching, "the live voters fetching from the new leader")
        check_wire_matches(c, moved, dead=leader)
    finally:
        stop_cluster(c)


def test_single_controller_answers_describe_quorum_as_a_one_voter_quorum(tmp_path):
    c = start_cluster(tmp_path / "single", 1)
    try:
        kafka = c.manifest()["kafka_bootstrap"]
        answer = describe_quorum_wire(kafka, 2)
        assert answer.error_code == 0
        [partition] = answer.topics[0].partitions
        [voter] = partition.current_voters
        assert partition.leader_id == voter.replica_id
        assert partition.leader_epoch >= 1 and partition.high_watermark > 0
        assert voter.log_end_offset == partition.high_watermark
        assert isinstance(voter.replica_directory_id, uuid.UUID)
        assert partition.observers == ()
        status = status_of(c, None)
        assert status is not None
        assert int(status["LeaderId"]) == voter.replica_id
        assert voter_ids(status) == [voter.replica_id]
        assert status["ClusterId"] and int(status["MaxFollowerLag"]) == 0
        v0 = describe_quorum_wire(kafka, 0)
        assert v0.topics[0].partitions[0].leader_id == voter.replica_id
    finally:
        stop_cluster(c)


def test_bad_arguments_and_unreachable_controllers_fail_in_one_line():
    bad = run_tide("quorum", "describe", "--status", "--bootstrap-controller", "nohostport")
    assert_one_line_error(bad, "--bootstrap-controller", "HOST:PORT")
    assert bad.returncode == 2
    gone = run_tide("quorum", "describe", "--replication", "--bootstrap-controller",
                    "127.0.0.1:1", timeout_s=60)
    assert_one_line_error(gone, "describe quorum", "UNAVAILABLE")
    assert gone.returncode == 1
    negative = run_tide("quorum", "remove-controller", "--bootstrap-controller", "127.0.0.1:1",
                        "--controller-id", "-1", "--controller-directory-id", "0" * 32)
    assert_one_line_error(negative, "--controller-id")
