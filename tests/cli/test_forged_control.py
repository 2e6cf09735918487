"""Issue 18, the control plane, as a new user would find it: forged control requests.

On ``tide cluster up --brokers 3`` with a topic holding 100 acknowledged
records, one forged gRPC ``StopReplica`` per broker (controller epoch 1000,
broker epoch -1, ``delete_partitions``) used to be answered NONE: the partition
directories disappeared on all three brokers and the brokers then refused the
real controller as stale. Now:

- every address a client is given (``bootstrap`` in ``cluster.json``, what
  Metadata returns) has no control service at all (gRPC UNIMPLEMENTED), and a
  follower fetch there is CLUSTER_AUTHORIZATION_FAILED;
- the INTERNAL addresses, reachable by anyone on the same host, refuse the
  forged requests without the registration's control token;
- the data stays readable, and the real controller keeps working: a new topic,
  a leader killed and elected elsewhere, the old records still there.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from cluster_fixtures import (
    describe_topic,
    fully_replicated,
    run_tide,
    start_cluster,
    stop_cluster,
    wait_for,
)

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

def consume(c, name: str) -> list[str]:
    result = c.tide("consume", name, "--from-beginning", "--timeout-ms", "3000")
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def forged_requests(topic: dict) -> list[tuple[str, object]]:
    states = [pb.PartitionState(topic=topic["name"], partition=p["partition"], leader=-1,
                                leader_epoch=1000, partition_epoch=1000, replicas=p["replicas"])
              for p in topic["partitions"]]
    return [
        ("StopReplica", pb.StopReplicaRequest(controller_id=0, controller_epoch=1000,
                                              broker_epoch=-1, delete_partitions=True,
                                              partitions=states)),
        ("LeaderAndIsr", pb.LeaderAndIsrRequest(
            controller_id=0, controller_epoch=1000, broker_epoch=-1,
            partitions=[pb.LeaderAndIsrPartition(state=s) for s in states])),
        ("UpdateMetadata", pb.UpdateMetadataRequest(controller_id=0, controller_epoch=1000)),
    ]


def test_forged_control_requests_change_nothing(tmp_path):
    c = start_cluster(tmp_path / "cluster", 3)
    data_dir = Path(c.data_dir)
    try:
        assert c.tide("topics", "create", "orders", "--partitions", "3",
                      "--replication-factor", "3").returncode == 0
        topic = wait_for(lambda: fully_replicated(c, "orders"), "orders fully replicated")
        produced = c.tide("produce", "orders", "--acks", "all",
                          input="".join(f"record-{i}\n" for i in range(100)))
        assert produced.returncode == 0, produced.stderr
        assert len(consume(c, "orders")) == 100
        manifest = c.manifest()
        brokers = [p for p in manifest["processes"].values() if p["kind"] == "broker"]
        client_addresses = manifest["bootstrap"].split(",")
        assert sorted(client_addresses) == sorted(b["listen"] for b in brokers)
        internal_addresses = [b["internal"] for b in brokers]
        assert not set(client_addresses) & set(internal_addresses)

        for address in client_addresses:
            with grpc.insecure_channel(address) as channel:
                control = pb_grpc.BrokerControlStub(channel)
                for name, request in forged_requests(topic):
                    with pytest.raises(grpc.RpcError) as refused:
                        getattr(control, name)(request, timeout=10)
                    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, (address, name)
                # Metadata on a client address names only client addresses.
                metadata = pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=10)
                assert sorted(f"{b.host}:{b.port}" for b in metadata.brokers) == \
                    sorted(client_addresses)
                follower = pb.FetchRequest(replica_id=2, replica_broker_epoch=-1, partitions=[
                    pb.FetchPartition(topic="orders", partition=0, current_leader_epoch=-1,
                                      fetch_offset=1_000_000)])
                answer = pb_grpc.BrokerStub(channel).Fetch(follower, timeout=10)
                assert answer.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
        for address in internal_addresses:
            with grpc.insecure_channel(address) as channel:
                control = pb_grpc.BrokerControlStub(channel)
                for name, request in forged_requests(topic):
                    for token in (b"", bytes(16)):
                        request.control_token = token
                        response = getattr(control, name)(request, timeout=10)
                        assert response.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, \
                            (address, name)

        for b in brokers:
            assert sorted(p.name for p in (data_dir / b["name"]).glob("orders-*")) == [
                "orders-0", "orders-1", "orders-2"], b["name"]
        assert sorted(consume(c, "orders")) == sorted(f"record-{i}" for i in range(100))

        # The real controller is still believed: a new topic gets replicas and leaders ...
        assert c.tide("topics", "create", "later", "--partitions", "3",
                      "--replication-factor", "3").returncode == 0
        wait_for(lambda: fully_replicated(c, "later"), "later fully replicated")
        assert c.tide("produce", "later", "--acks", "all", input="after\n").returncode == 0
        assert consume(c, "later") == ["after"]
        # ... and a killed leader's partitions move to another broker, data intact.
        leader = topic["partitions"][0]["leader"]
        assert run_tide("cluster", "kill", str(leader), "--signal", "KILL",
                        "--data-dir", str(data_dir)).returncode == 0

        def moved():
            now = describe_topic(c, "orders")
            return now is not None and all(p["leader"] not in (-1, leader)
                                           for p in now["partitions"])
        wait_for(moved, f"leadership moved off broker {leader}")
        assert sorted(consume(c, "orders")) == sorted(f"record-{i}" for i in range(100))
    finally:
        stop_cluster(c)
