"""The ControllerQuorum gRPC service: Raft messages in, and the small admin surface.

Errors become codes here and nowhere else: a ``TidewaterError`` answers its
``error_code``; an ``InvariantViolation`` is not caught (it reaches the
supervisor, as everywhere).

Who may call, with mTLS (``config.tls`` set; the handshake already requires a
certificate of the cluster's CA): RaftMessages, QuorumRead and QuorumPropose
only a controller's certificate (``transport.check_controller_principal``);
ChangeQuorumVoters a controller's, or a client's when the cluster has no
authorizer (``clients_may_change_voters``); DescribeQuorum any (read-only, what
``tide quorum describe`` needs). Without TLS the inbound checks of
``transport.check_batch`` are all there is.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from tidewater.controller.quorum.record_log import CommittedRecords
from tidewater.controller.quorum.shell import QuorumShell
from tidewater.controller.quorum.transport import check_batch, check_controller_principal
from tidewater.controller.raft import VoterKey
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import (
    ClusterAuthorizationFailedError,
    InvalidRequestError,
    TidewaterError,
)
from tidewater.proto.tls import ROLE_CLIENT, Principal, principal_of

log = logging.getLogger("tidewater.controller.quorum")


def _voter(key: VoterKey) -> pb.QuorumVoter:
    return pb.QuorumVoter(id=key.id, directory_id=key.directory_id)


def _voter_key(voter: pb.QuorumVoter) -> VoterKey:
    directory_id = voter.directory_id
    if len(directory_id) != 32 or any(c not in "0123456789abcdef" for c in directory_id):
        raise InvalidRequestError(f"directory id {directory_id!r:.40} is not 32 hex digits")
    return VoterKey(voter.id, directory_id)


def describe_response(shell: QuorumShell) -> pb.DescribeQuorumResponse:
    """This node's view of the quorum (the leader's holds every replica's progress): the
    ControllerQuorum DescribeQuorum answer, and the controller's own for brokers."""
    try:
        described = shell.describe()
    except TidewaterError as e:
        return pb.DescribeQuorumResponse(error_code=e.error_code)
    now_ms = shell.now_ms()
    return pb.DescribeQuorumResponse(
        local=_voter(described.local), role=described.role.value, epoch=described.epoch,
        leader_id=-1 if described.leader_id is None else described.leader_id,
        high_watermark=described.high_watermark,
        log_start_offset=described.log_start_offset,
        log_end_offset=described.log_end_offset,
        voters=[_voter(v) for v in sorted(described.voters)],
        replicas=[pb.QuorumReplicaState(
            replica=_voter(r.key), is_voter=r.is_voter, log_end_offset=r.log_end_offset,
            lag=r.lag,
            last_fetch_age_ms=-1 if r.last_fetch_ms is None else now_ms - r.last_fetch_ms,
            last_caught_up_age_ms=(-1 if r.last_caught_up_ms is None
                                   else now_ms - r.last_caught_up_ms))
            for r in described.replicas],
        applied_offset=shell.records.applied_offset,
        cluster_id=getattr(shell.records, "cluster_id", ""),
        endpoints=[pb.QuorumEndpoint(id=node_id, host=e.host, port=e.port) for node_id, e in
                   sorted({**shell.config.observers, **shell.config.voters}.items())])


def _principal(context: grpc.aio.ServicerContext[Any, Any]) -> Principal | None:
    return principal_of({k: list(v) for k, v in context.auth_context().items()})


class QuorumService(pb_grpc.ControllerQuorumServicer):
    def __init__(self, shell: QuorumShell):
        self.shell = shell
        self._mtls = shell.config.tls is not None

    def _require_controller(self, context: grpc.aio.ServicerContext[Any, Any], *,
                            source_id: int | None = None, what: str) -> None:
        if self._mtls:
            check_controller_principal(_principal(context), source_id=source_id, what=what)

    def _require_voter_admin(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if not self._mtls:
            return
        principal = _principal(context)
        if (principal is not None and principal.role == ROLE_CLIENT
                and self.shell.config.clients_may_change_voters):
            return
        try:
            check_controller_principal(principal, what="voter changes")
        except ClusterAuthorizationFailedError as e:
            raise ClusterAuthorizationFailedError(
                f"{e} (with an authorizer, only a controller's certificate may change the "
                f"quorum's voters)") from None

    async def RaftMessages(self, request: pb.RaftMessageBatch,
                           context: grpc.aio.ServicerContext[pb.RaftMessageBatch,
                                                             pb.RaftMessageAck],
                           ) -> pb.RaftMessageAck:
        shell = self.shell
        try:
            self._require_controller(context, source_id=request.source_id, what="Raft messages")
            messages = check_batch(request, local_id=shell.config.node_id,
                                   peers=shell.config.peers, peer=context.peer())
            shell.step(messages)
        except TidewaterError as e:
            log.warning("refused Raft messages from node %d (%s): %s", request.source_id,
                        context.peer(), e)
            return pb.RaftMessageAck(error_code=e.error_code, error_message=str(e))
        return pb.RaftMessageAck()

    async def QuorumPropose(self, request: pb.QuorumProposeRequest,
                            context: grpc.aio.ServicerContext[pb.QuorumProposeRequest,
                                                              pb.QuorumProposeResponse],
                            ) -> pb.QuorumProposeResponse:
        shell = self.shell
        try:
            self._require_controller(context, what="proposals")
            if not request.records:
                raise InvalidRequestError("no records")
            if not isinstance(shell.records, CommittedRecords):
                # The controller's metadata: only its owner proposes (checked records).
                raise InvalidRequestError("this quorum replicates the controller's metadata: "
                                          "it takes no proposals from outside")
            first, epoch = await shell.propose(list(request.records), request.timeout_ms)
        except TidewaterError as e:
            leader = shell.leader_hint()
            return pb.QuorumProposeResponse(error_code=e.error_code, error_message=str(e),
                                            leader_id=leader)
        return pb.QuorumProposeResponse(leader_id=shell.config.node_id, first_offset=first,
                                        epoch=epoch)

    async def QuorumRead(self, request: pb.QuorumReadRequest,
                         context: grpc.aio.ServicerContext[pb.QuorumReadRequest,
                                                           pb.QuorumReadResponse],
                         ) -> pb.QuorumReadResponse:
        shell = self.shell
        try:
            self._require_controller(context, what="reads of the metadata log")
        except TidewaterError as e:
            log.warning("refused a QuorumRead from %s: %s", context.peer(), e)
            return pb.QuorumReadResponse(error_code=e.error_code)
        limit = shell.config.read_records_max
        count = limit if request.max_records <= 0 else min(request.max_records, limit)
        application = shell.records
        if not isinstance(application, CommittedRecords):
            # The metadata image keeps no records: only its applied offset is known.
            return pb.QuorumReadResponse(applied_offset=application.applied_offset)
        records = application.read(request.start_offset, count)
        return pb.QuorumReadResponse(
            records=[pb.QuorumRecord(offset=r.offset, epoch=r.epoch, data=r.data)
                     for r in records],
            applied_offset=application.applied_offset)

    async def DescribeQuorum(self, request: pb.DescribeQuorumRequest,
                             context: grpc.aio.ServicerContext[pb.DescribeQuorumRequest,
                                                               pb.DescribeQuorumResponse],
                             ) -> pb.DescribeQuorumResponse:
        return describe_response(self.shell)

    async def ChangeQuorumVoters(self, request: pb.ChangeQuorumVotersRequest,
                                 context: grpc.aio.ServicerContext[pb.ChangeQuorumVotersRequest,
                                                                   pb.ChangeQuorumVotersResponse],
                                 ) -> pb.ChangeQuorumVotersResponse:
        shell = self.shell
        try:
            self._require_voter_admin(context)
            add = _voter_key(request.add) if request.HasField("add") else None
            remove = _voter_key(request.remove) if request.HasField("remove") else None
            if add is None and remove is None:
                raise InvalidRequestError("neither add nor remove")
            await shell.change_voters(add=add, remove=remove, timeout_ms=request.timeout_ms)
        except TidewaterError as e:
            leader = shell.leader_hint()
            return pb.ChangeQuorumVotersResponse(error_code=e.error_code, error_message=str(e),
                                                 leader_id=leader)
        return pb.ChangeQuorumVotersResponse(leader_id=shell.config.node_id)
