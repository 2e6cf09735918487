"""Issue 29 item 2: ReplicaFetch on a SASL cluster without TLS needs a broker principal.

On ``tide cluster up --sasl-mechanisms ...`` (SASL_PLAINTEXT, an ACL authorizer) anyone
who reached a leader's INTERNAL address could send ReplicaFetch as an in-sync follower:
it moved the high watermark (acks=all answered before the followers had the data) and
read every topic, uncommitted records included, with no READ ACL. Now a follower fetch
needs an authenticated caller with CLUSTER_ACTION on the cluster (the brokers' own
``broker`` super user), as in Kafka:

- no credentials: the stream is refused (UNAUTHENTICATED), nothing read;
- a real user who is not a super user (or a wrong password): CLUSTER_AUTHORIZATION_FAILED
  / UNAUTHENTICATED, no records;
- the brokers still replicate each other (acks=all with min.insync.replicas=2).
"""

from __future__ import annotations

import grpc
import pytest
from cluster_fixtures import fully_replicated, run_tide, start_cluster, stop_cluster, wait_for

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.scram import plain_metadata
from tidewater.tools.cluster_sasl import read_password

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("replica-fetch-auth"), 2, "min.insync.replicas=2",
                      up_flags=("--sasl-mechanisms", "PLAIN,SCRAM-SHA-512"))
    yield c
    stop_cluster(c)


def _follower_fetch(leader_internal: str, follower_id: int, metadata=()) -> pb.FetchResponse:
    request = pb.FetchRequest(replica_id=follower_id, replica_broker_epoch=-1, max_wait_ms=0,
                              partitions=[pb.FetchPartition(topic="orders", partition=0,
                                                            current_leader_epoch=-1,
                                                            fetch_offset=0)])
    with grpc.insecure_channel(leader_internal) as channel:
        answers = pb_grpc.BrokerControlStub(channel).ReplicaFetch(
            iter([request]), metadata=list(metadata) or None, timeout=10)
        return next(answers)


def test_a_follower_fetch_needs_a_broker_principal(sasl_cluster):
    c = sasl_cluster
    manifest = c.manifest()
    config = manifest["sasl"]["command_config"]

    def tide(*args, **kwargs):
        return run_tide(*args, "--command-config", config, bootstrap=c.bootstrap, **kwargs)

    created = tide("topics", "create", "orders", "--partitions", "1", "--replication-factor", "2")
    assert created.returncode == 0, created.stderr
    # The brokers fetch from each other as their own super user: the ISR fills and an
    # acks=all produce with min.insync.replicas=2 is answered.
    assert tide("users", "create", "mallory", "--password", "mallory-pw").returncode == 0
    topic = wait_for(lambda: fully_replicated(_Admin(tide), "orders", replicas=2),
                     "orders fully replicated")
    produced = tide("produce", "orders", "--acks", "all",
                    input="".join(f"secret-{i}\n" for i in range(10)))
    assert produced.returncode == 0, produced.stderr

    leader = topic["partitions"][0]["leader"]
    follower = next(r for r in topic["partitions"][0]["replicas"] if r != leader)
    internal = manifest["processes"][f"broker-{leader}"]["internal"]

    with pytest.raises(grpc.RpcError) as anonymous:
        _follower_fetch(internal, follower)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED

    with pytest.raises(grpc.RpcError) as wrong:
        _follower_fetch(internal, follower, [plain_metadata("broker", "guessed")])
    assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # A real user, but not a cluster member: refused, no records.
    mallory = _follower_fetch(internal, follower, [plain_metadata("mallory", "mallory-pw")])
    assert mallory.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
    assert not any(p.records for p in mallory.partitions)

    # The admin is a super user: CLUSTER_ACTION, as in Kafka (the check is the ACL's).
    admin = _follower_fetch(internal, follower,
                            [plain_metadata("admin", read_password(config) or "")])
    assert admin.error_code == pb.NONE


class _Admin:
    """What ``fully_replicated`` calls: ``tide(...)`` as the admin."""

    def __init__(self, tide):
        self.tide = tide
