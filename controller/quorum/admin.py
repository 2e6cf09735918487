"""Clients of the ControllerQuorum admin RPCs, shared by ``python -m
tidewater.controller.quorum`` and ``tide quorum`` (kafka-metadata-quorum.sh).

``describe_leader`` asks the given controllers (their Raft endpoints, what Kafka's
``--bootstrap-controller`` names) for the quorum and keeps the leader's answer: only
the leader knows every replica's progress. ``change_voters`` sends KIP-853
AddVoter/RemoveVoter to each in turn until the leader takes it. Failures raise typed
``TidewaterError``s (``NOT_CONTROLLER`` when no given controller leads).
``credentials``: the channel's TLS (a quorum whose controllers run with ``--tls-*``
speaks mTLS on its Raft port; a client certificate may describe, and change voters
only where the cluster has no authorizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import (
    InvalidRequestError,
    NotControllerError,
    TidewaterError,
    error_for_code,
)

CALL_TIMEOUT_S = 10.0


def _channel(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    if credentials is None:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, credentials)


def parse_controllers(text: str) -> list[str]:
    """``HOST:PORT[,HOST:PORT...]`` -> the addresses; anything else is an InvalidRequestError."""
    addresses = [a.strip() for a in text.split(",") if a.strip()]
    if not addresses:
        raise InvalidRequestError("no controller given (expected HOST:PORT[,HOST:PORT...])")
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidRequestError(f"bad controller address {address!r} (expected HOST:PORT)")
    return addresses


def describe_one(address: str, timeout_s: float = CALL_TIMEOUT_S,
                 credentials: grpc.ChannelCredentials | None = None,
                 ) -> pb.DescribeQuorumResponse:
    """One node's DescribeQuorum answer (its own view: followers know no replica progress)."""
    with _channel(address, credentials) as channel:
        answer: pb.DescribeQuorumResponse = pb_grpc.ControllerQuorumStub(channel).DescribeQuorum(
            pb.DescribeQuorumRequest(), timeout=timeout_s)
    return answer


def describe_json(described: pb.DescribeQuorumResponse) -> dict[str, object]:
    """The answer as the JSON ``python -m tidewater.controller.quorum describe`` prints."""
    return {
        "node": described.local.id, "role": described.role, "epoch": described.epoch,
        "leader_id": described.leader_id, "high_watermark": described.high_watermark,
        "log_end_offset": described.log_end_offset,
        "voters": [f"{v.id}:{v.directory_id}" for v in described.voters],
        "replicas": [{"id": r.replica.id, "directory_id": r.replica.directory_id,
                      "is_voter": r.is_voter, "log_end_offset": r.log_end_offset,
                      "lag": r.lag} for r in described.replicas]}


def describe_leader(addresses: Sequence[str], timeout_s: float = CALL_TIMEOUT_S,
                    credentials: grpc.ChannelCredentials | None = None,
                    ) -> pb.DescribeQuorumResponse:
    """The leader's DescribeQuorum answer, from whichever given controller leads."""
    failures: list[str] = []
    leader_hint = -1
    for address in addresses:
        try:
            answer = describe_one(address, timeout_s, credentials)
        except grpc.RpcError as e:
            failures.append(f"{address}: {e.code().name}")
            continue
        if answer.error_code != pb.NONE:
            failures.append(f"{address}: {pb.ErrorCode.Name(answer.error_code)}")
            continue
        if answer.role == "leader" and answer.leader_id == answer.local.id:
            return answer
        leader_hint = answer.leader_id if answer.leader_id >= 0 else leader_hint
        failures.append(f"{address}: node {answer.local.id} is {answer.role}")
    hint = f"; the leader is node {leader_hint}, give its address" if leader_hint >= 0 else ""
    raise NotControllerError(f"no given controller leads the quorum ({'; '.join(failures)}){hint}")


@dataclass(frozen=True)
class VoterChange:
    controller_id: int
    directory_id: str
    add: bool  # False: remove


def change_voters(addresses: Sequence[str], change: VoterChange, timeout_ms: int = 10_000,
                  credentials: grpc.ChannelCredentials | None = None) -> int:
    """Sends the change to each controller until the leader takes it; returns the leader id."""
    voter = pb.QuorumVoter(id=change.controller_id, directory_id=change.directory_id)
    request = (pb.ChangeQuorumVotersRequest(add=voter, timeout_ms=timeout_ms) if change.add
               else pb.ChangeQuorumVotersRequest(remove=voter, timeout_ms=timeout_ms))
    failures: list[str] = []
    last_error: TidewaterError | None = None
    for address in addresses:
        try:
            with _channel(address, credentials) as channel:
                answer: pb.ChangeQuorumVotersResponse = pb_grpc.ControllerQuorumStub(
                    channel).ChangeQuorumVoters(request, timeout=timeout_ms / 1000 + 10)
        except grpc.RpcError as e:
            failures.append(f"{address}: {e.code().name}")
            continue
        if answer.error_code == pb.NONE:
            return int(answer.leader_id)
        error = error_for_code(answer.error_code, answer.error_message)
        if not isinstance(error, NotControllerError):
            raise error  # the leader refused it: no other controller would take it
        last_error = error
        failures.append(f"{address}: {answer.error_message or 'NOT_CONTROLLER'}")
    if last_error is not None:
        raise NotControllerError(f"no given controller leads the quorum ({'; '.join(failures)})")
    raise NotControllerError(f"no controller answered ({'; '.join(failures)})")
