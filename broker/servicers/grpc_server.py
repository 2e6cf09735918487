"""The broker's gRPC surface: ``Broker`` on each listener, ``BrokerControl`` on INTERNAL.

Each listener (INTERNAL, optional EXTERNAL) is its own ``grpc.aio`` server
with its own servicer instance that knows the listener's name, so Metadata
answers with the brokers' addresses on the listener the request came in on.
Only the INTERNAL server has ``BrokerControl`` (the controller's LeaderAndIsr,
UpdateMetadata, StopReplica and the followers' ReplicaFetch): a client given
the EXTERNAL address cannot reach it, and a follower fetch (replica_id >= 0)
sent to ``Broker`` is refused with CLUSTER_AUTHORIZATION_FAILED, since a
forged one could move the high watermark past what followers really hold.
The controller's requests are authenticated with the registration's control
token besides (``control_rules``). With TLS configured every listener speaks
TLS only (``build_server``'s credentials); the INTERNAL one requires a client
certificate from the cluster's CA, and ``BrokerControl`` takes each call only
from the principal ``control_rules.control_principal_refusal`` allows (the
controller's requests from a ``controller`` certificate, a follower's fetches
from the ``broker-<id>`` certificate of the replica id it fetches as, a
transaction coordinator's WriteTxnMarkers and a leader's VerifyTxnPartitions from any
broker certificate). With SASL or an authorizer, whatever the transport, a ReplicaFetch
stream (and a WriteTxnMarkers or VerifyTxnPartitions call) also needs an
authenticated caller (``BrokerSecurity.authenticate_grpc``; refused: UNAUTHENTICATED) with
CLUSTER_ACTION on the cluster (``inter_broker``; else every request is
CLUSTER_AUTHORIZATION_FAILED): a follower fetch moves the high watermark and reads
uncommitted records of every topic.
With client security on (``broker.security``: SASL or an authorizer), each
client RPC first learns who calls (``BrokerSecurity.authenticate_grpc``: the
password checked off the event loop, a refusal answered
connection.failed.authentication.delay.ms late; refused: UNAUTHENTICATED) and drops what the caller may not do: produce needs WRITE
(and WRITE on the request's transactional id, if it names one: TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
fetch READ, ListOffsets, OffsetForLeaderEpoch and DescribeReplicas DESCRIBE
(TOPIC_AUTHORIZATION_FAILED per partition), Metadata lists only describable
topics (a named one is UNKNOWN_TOPIC_OR_PARTITION). The transaction RPCs check what
Kafka's transaction APIs check (``broker/txn/grpc_service.py``).
Every RPC is timed (``request_latency_seconds{rpc}``); an unexpected
exception escaping a handler is logged and answered as UNKNOWN_SERVER_ERROR
where the response has a request-level code, else as gRPC INTERNAL. A broken
invariant (``InvariantViolation``) is not answered: the broker stops
(``TaskSupervisor.fail``), and the call ends with INTERNAL.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, cast

import grpc
from google.protobuf.message import Message

from tidewater.broker.coordinators import Coordinators
from tidewater.broker.error_mapping import error_code_for, wire_code
from tidewater.broker.metrics import BrokerMetrics
from tidewater.broker.replicas.metadata_cache import MetadataCache
from tidewater.broker.replicas.replica_manager import ReplicaManager, produce_error_response
from tidewater.broker.replication.control_rules import (
    client_fetch_refusal,
    control_principal_refusal,
)
from tidewater.broker.security import grpc_auth
from tidewater.broker.security.authorizer import Session
from tidewater.broker.security.settings import BrokerSecurity, may_init_producer_id
from tidewater.broker.servicers.admin_forwarding import Context
from tidewater.broker.servicers.grpc_limits import GrpcLimits
from tidewater.broker.servicers.grpc_quotas import GrpcQuotas, client_id_of, hold, quota_user
from tidewater.broker.serving.replica_fetch_wire import encode_fetch_response
from tidewater.broker.serving.txn_markers import (
    TxnMarkerResult,
    markers_from_proto,
    results_to_proto,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.acls import (
    DELETE,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
)
from tidewater.proto.errors import BrokerNotAvailableError, InvariantViolation

if TYPE_CHECKING:
    from tidewater.broker.group.grpc_service import GroupAllowed, GroupRpcs
    from tidewater.broker.txn.grpc_service import TxnRpcs
from tidewater.proto.malloc_tuning import tune_malloc_for_large_buffers
from tidewater.proto.scram import SaslAuthenticationError
from tidewater.proto.supervisor import TaskSupervisor
from tidewater.proto.tls import Principal, principal_of

log = logging.getLogger("tidewater.broker.servicers.grpc_server")


def _nothing() -> None:
    pass


def _fetch_error(code: int) -> pb.FetchResponse:
    return pb.FetchResponse(error_code=wire_code(code))


def _fetch_error_bytes(code: int) -> bytes:
    return encode_fetch_response((), error_code=code)


# Responses with a request-level error_code field.
_REQUEST_LEVEL_ERROR: dict[str, Callable[..., Message]] = {
    "Fetch": pb.FetchResponse,
    "LeaderAndIsr": pb.LeaderAndIsrResponse,
    "UpdateMetadata": pb.UpdateMetadataResponse,
    "StopReplica": pb.StopReplicaResponse,
}

_Request = TypeVar("_Request", bound=Message)
_Answer = TypeVar("_Answer")  # a stream's answer: a message, or its wire bytes
# A unary handler (self, request, context) -> response, as ``_rpc`` takes and gives it.
_Handler = TypeVar("_Handler", bound=Callable[..., Awaitable[Message]])
# A topic -> its configs as Kafka's DescribeConfigs lists them: (name, value, ConfigSource).
TopicConfigsOf = Callable[[str], list[tuple[str, str, int]]]


def _rpc(name: str) -> Callable[[_Handler], _Handler]:
    def wrap(handler: _Handler) -> _Handler:
        @functools.wraps(handler)
        async def timed(self: _Servicer, request: Message, context: Context) -> Message:
            started = time.perf_counter()
            try:
                response: Message = await handler(self, request, context)
                return response
            except InvariantViolation as e:
                await self._fail(e, context)
            except BrokerNotAvailableError as e:
                # Not ready for it yet (not registered): a transport-level "try again".
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            except Exception as e:  # the one boundary for escaped errors
                code, message = error_code_for(e, context=name)
                response_type = _REQUEST_LEVEL_ERROR.get(name)
                if response_type is not None:
                    return response_type(error_code=code)
                await context.abort(grpc.StatusCode.INTERNAL,
                                    f"{pb.ErrorCode.Name(code)}: {message}")
            finally:
                self._observer(name)(time.perf_counter() - started)
        # ``timed`` takes and gives what ``handler`` does (mypy's decorator idiom).
        return cast(_Handler, timed)
    return wrap


class _Servicer:
    """What both services share: the replica manager, timing, the invariant boundary."""

    def __init__(self, replica_manager: ReplicaManager, metrics: BrokerMetrics) -> None:
        self.replica_manager = replica_manager
        self.metrics = metrics
        # rpc name -> request_latency child's observe
        self._observe_latency: dict[str, Callable[[float], None]] = {}

    async def _fail(self, error: InvariantViolation, context: Context) -> NoReturn:
        """A broken invariant reached the boundary: the broker stops (``TaskSupervisor``)
        and this call ends with INTERNAL; nothing is answered as if it were normal."""
        self.replica_manager.supervisor.fail(error)
        await context.abort(grpc.StatusCode.INTERNAL, f"broker invariant broken: {error}")

    def _observer(self, name: str) -> Callable[[float], None]:
        """``request_latency``'s observe for RPC ``name``, the labelled child looked up once
        per name (prometheus_client's labels() took a lock and showed in profiles of busy
        brokers; ``LocalHistogram.labels`` is still a call and a dict probe)."""
        observe = self._observe_latency.get(name)
        if observe is None:
            observe = self._observe_latency[name] = self.metrics.request_latency.labels(name).observe
        return observe

    async def _fetch_stream(self, context: grpc.aio.ServicerContext[pb.FetchRequest, _Answer],
                            name: str, refusal: Callable[[int], int | None],
                            answer: Callable[[pb.FetchRequest], Awaitable[_Answer]],
                            refused: Callable[[int], _Answer]) -> None:
        """One fetch after another on a stream; ``refusal``: replica_id -> the ErrorCode
        refusing that request (or None to serve it); ``answer``: a served request's
        response; ``refused``: the response for a request-level ErrorCode (each a
        message, or its wire bytes where the method is registered without protobuf's
        serializer)."""
        observe = self._observer(name)
        reader = _StreamReader(context, self.replica_manager)
        try:
            while (request := await reader.read()) is not None:
                started = time.perf_counter()
                try:
                    if code := refusal(request.replica_id):
                        response = refused(code)
                    else:
                        response = await answer(request)
                except InvariantViolation as e:
                    await self._fail(e, context)
                except Exception as e:  # the one boundary for escaped errors
                    response = refused(error_code_for(e, context=name)[0])
                await context.write(response)
                observe(time.perf_counter() - started)
        finally:
            reader.close()


class BrokerServicer(_Servicer, pb_grpc.BrokerServicer):
    """What clients call; on every listener."""

    def __init__(self, replica_manager: ReplicaManager, metadata_cache: MetadataCache,
                 metrics: BrokerMetrics, listener_name: str,
                 security: BrokerSecurity | None = None,
                 coordinators: Coordinators | None = None,
                 topic_configs: TopicConfigsOf | None = None) -> None:
        super().__init__(replica_manager, metrics)
        self.metadata_cache = metadata_cache
        # A known topic's configs as DescribeConfigs lists them (name, value, source);
        # None: this broker describes none (UNKNOWN_TOPIC_OR_PARTITION).
        self._topic_configs = topic_configs
        self.listener_name = listener_name
        # The group and transaction RPCs: built, with their modules and the coordinators
        # under them, at the first such call (broker/coordinators.py).
        self._coordinators = coordinators
        self._groups: GroupRpcs | None = None
        self._txns: TxnRpcs | None = None
        # broker.security.BrokerSecurity; None or not ``secured``: no checks, as before.
        self.security = security if security is not None and security.secured else None
        self.quotas = GrpcQuotas(lambda: metadata_cache.client_quotas)

    @property
    def groups(self) -> GroupRpcs:
        if self._groups is None:
            from tidewater.broker.group.grpc_service import GroupRpcs
            c = self._coordinators
            self._groups = GroupRpcs(c.group if c is not None else None, self.metadata_cache,
                                     self.listener_name)
        return self._groups

    @property
    def txns(self) -> TxnRpcs:
        if self._txns is None:
            from tidewater.broker.txn.grpc_service import TxnRpcs
            c = self._coordinators
            self._txns = TxnRpcs(c.txn if c is not None else None,
                                 c.group if c is not None else None, self.metadata_cache,
                                 self.listener_name)
        return self._txns

    async def _session(self, context: Context, security: BrokerSecurity) -> Session:
        """This call's caller; an unauthenticated one is refused here (UNAUTHENTICATED)."""
        try:
            return await security.authenticate_grpc(context)
        except SaslAuthenticationError as e:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"SASL_AUTHENTICATION_FAILED: {e}")
            raise

    async def _session_or_none(self, context: Context) -> Session | None:
        """This call's caller; None when security is off. An unauthenticated caller is
        refused here (UNAUTHENTICATED)."""
        security = self.security
        return None if security is None else await self._session(context, security)

    async def _caller(self, context: Context) -> tuple[Session | None, str, str]:
        """(session or None, quota user, client-id) of a produce or fetch call."""
        session = await self._session_or_none(context)
        return session, quota_user(session), client_id_of(context.invocation_metadata())

    def _topic_rights(self, session: Session | None) -> grpc_auth.Allowed | None:
        """(operation, topic) -> may, for ``session``; None: security is off."""
        security = self.security
        if security is None or session is None:
            return None
        return lambda operation, topic: security.allows(session, operation, TOPIC, topic)

    def _all_rights(self, session: Session | None) -> Callable[[int, int, str], bool] | None:
        """(operation, resource type, name) -> may, for ``session``; None: security is off."""
        security = self.security
        if security is None or session is None:
            return None
        return lambda operation, kind, name: security.allows(session, operation, kind, name)

    async def _allowed(self, context: Context) -> grpc_auth.Allowed | None:
        return self._topic_rights(await self._session_or_none(context))

    async def _rights(self, context: Context) -> Callable[[int, int, str], bool] | None:
        return self._all_rights(await self._session_or_none(context))

    async def _group_allowed(self, context: Context) -> GroupAllowed | None:
        """(operation, group) -> may, for this call's caller; None: security is off."""
        security = self.security
        if security is None:
            return None
        session = await self._session(context, security)
        return lambda operation, group: security.allows(session, operation, GROUP, group)

    @_rpc("Produce")
    async def Produce(self, request: pb.ProduceRequest, context: Context) -> pb.ProduceResponse:
        session, user, client_id = await self._caller(context)
        # Charged as it is read, as the Kafka listener charges; the answer waits out
        # the throttle (``grpc_quotas``).
        throttle_ms = self.quotas.charge_produce(user, client_id, request)
        rights = self._all_rights(session)
        if rights is None:
            response = await self.replica_manager.produce(request)
        else:
            denied = _produce_refusals(request, rights)
            response = (await self.replica_manager.produce(request) if request.partitions
                        else pb.ProduceResponse())
            response.partitions.extend(denied)
        await hold(throttle_ms)
        return response

    @_rpc("Fetch")
    async def Fetch(self, request: pb.FetchRequest, context: Context) -> pb.FetchResponse:
        if code := client_fetch_refusal(request.replica_id):
            return pb.FetchResponse(error_code=wire_code(code))
        session, user, client_id = await self._caller(context)
        allowed = self._topic_rights(session)
        if allowed is None:
            response = await self.replica_manager.fetch(request)
        else:
            denied = grpc_auth.fetch_refusals(request, allowed)
            response = (await self.replica_manager.fetch(request) if request.partitions
                        else pb.FetchResponse())
            response.partitions.extend(denied)
        await hold(self.quotas.charge_fetch(user, client_id, response))
        return response

    async def FetchStream(self, request_iterator: AsyncIterator[pb.FetchRequest],
                          context: grpc.aio.ServicerContext[pb.FetchRequest, pb.FetchResponse]
                          ) -> None:
        """Consumer fetches on one long-lived stream: the ReplicaFetch loop, own label.

        A message on an open stream costs about half the CPU of a unary call (both sides),
        and a caught-up consumer sends one fetch per record it is woken for."""
        session, user, client_id = await self._caller(context)
        allowed = self._topic_rights(session)
        replica_manager = self.replica_manager
        quotas = self.quotas

        async def answer(request: pb.FetchRequest) -> pb.FetchResponse:
            denied = [] if allowed is None else grpc_auth.fetch_refusals(request, allowed)
            response = (await replica_manager.fetch(request)
                        if request.partitions or not denied else pb.FetchResponse())
            response.partitions.extend(denied)
            # The answer, and so the stream's next fetch, waits out the throttle.
            await hold(quotas.charge_fetch(user, client_id, response))
            return response
        await self._fetch_stream(context, "FetchStream", client_fetch_refusal, answer,
                                 _fetch_error)

    async def ProduceStream(self, request_iterator: AsyncIterator[pb.ProduceRequest],
                            context: grpc.aio.ServicerContext[pb.ProduceRequest,
                                                              pb.ProduceResponse]) -> None:
        """Produce requests on one long-lived stream, appended in arrival order.

        Request N is appended (``produce_append``) before request N+1 is read, so requests
        in flight for one partition keep their order. An acks=all request then waits in
        the purgatory (``produce_watch``, no task of its own) and is answered when it
        completes, possibly after later ones: the response carries the request's
        correlation_id. acks=0 is never answered. Writes are serialised (one
        ``context.write`` at a time, as grpc.aio requires; ``_AnswerWriter``).
        A failing request is answered with its error; the stream goes on. When the client
        half-closes, the pending answers are sent and the stream ends; at broker shutdown
        the stream stops reading and ends after its pending answers (the client resends
        what was not answered); when the client cancels, pending waits are withdrawn.
        """
        replica_manager = self.replica_manager
        session, user, client_id = await self._caller(context)
        rights = self._all_rights(session)
        quotas = self.quotas
        writer = _AnswerWriter(context, self._observer("ProduceStream"),
                               self.replica_manager.supervisor)
        withdraws: dict[int, Callable[[], None]] = {}  # id -> withdraw of an acks=all wait
        ids = itertools.count()

        def answer_later(wait_id: int, started: float, response: pb.ProduceResponse) -> None:
            if withdraws.pop(wait_id, None) is not None:
                writer.send_later(response, started)

        reader = _StreamReader(context, replica_manager)
        try:
            while (request := await reader.read()) is not None:
                started = time.perf_counter()
                denied = [] if rights is None else _produce_refusals(request, rights)
                try:
                    response, waits = await replica_manager.produce_append(request)
                    response.partitions.extend(denied)
                except InvariantViolation as e:
                    await self._fail(e, context)
                except Exception as e:  # the one boundary for escaped errors
                    response, waits = produce_error_response(request, e, context="ProduceStream"), []
                if waits:
                    wait_id = next(ids)
                    withdraws[wait_id] = _nothing  # pending before produce_watch may answer
                    withdraw = replica_manager.produce_watch(
                        request, response, waits,
                        functools.partial(answer_later, wait_id, started))
                    if wait_id in withdraws:
                        withdraws[wait_id] = withdraw
                elif request.acks != 0:
                    await writer.write(response, started)
                # Over its quota: the next request is read only after the throttle (the
                # Kafka listener mutes the connection the same way).
                await hold(quotas.charge_produce(user, client_id, request))
            while withdraws:
                await writer.idle()  # the pending acks=all answers, as they complete
            await writer.drain()
        finally:
            reader.close()
            for withdraw in withdraws.values():
                withdraw()
            writer.close()

    @_rpc("ListOffsets")
    async def ListOffsets(self, request: pb.ListOffsetsRequest, context: Context
                         ) -> pb.ListOffsetsResponse:
        allowed = await self._allowed(context)
        denied = [] if allowed is None else grpc_auth.list_offsets_refusals(request, allowed)
        response = self.replica_manager.list_offsets(request)
        response.partitions.extend(denied)
        return response

    @_rpc("OffsetForLeaderEpoch")
    async def OffsetForLeaderEpoch(self, request: pb.OffsetForLeaderEpochRequest, context: Context
                                  ) -> pb.OffsetForLeaderEpochResponse:
        allowed = await self._allowed(context)
        denied = ([] if allowed is None
                  else grpc_auth.offset_for_leader_epoch_refusals(request, allowed))
        response = self.replica_manager.offset_for_leader_epoch(request)
        response.partitions.extend(denied)
        return response

    @_rpc("Metadata")
    async def Metadata(self, request: pb.MetadataRequest, context: Context) -> pb.MetadataResponse:
        allowed = await self._allowed(context)
        response = self.metadata_cache.metadata_response(list(request.topics),
                                                         self.listener_name)
        if allowed is not None:
            grpc_auth.hide_undescribable(response, allowed, named=bool(request.topics))
        return response

    @_rpc("DescribeReplicas")
    async def DescribeReplicas(self, request: pb.DescribeReplicasRequest, context: Context
                              ) -> pb.DescribeReplicasResponse:
        allowed = await self._allowed(context)
        response = self.replica_manager.describe_replicas(request)
        if allowed is not None:
            kept = [r for r in response.replicas if allowed(DESCRIBE, r.topic)]
            del response.replicas[:]
            response.replicas.extend(kept)
        return response

    @_rpc("DescribeTopicConfigs")
    async def DescribeTopicConfigs(self, request: pb.DescribeTopicConfigsRequest,
                                   context: Context) -> pb.DescribeTopicConfigsResponse:
        allowed = await self._allowed(context)
        known = set(self.metadata_cache.topics())
        response = pb.DescribeTopicConfigsResponse()
        for topic in request.topics:
            result = response.topics.add(topic=topic, error_code=pb.NONE)
            if allowed is not None and not allowed(DESCRIBE_CONFIGS, topic):
                result.error_code = pb.TOPIC_AUTHORIZATION_FAILED
                result.error_message = f"needs DESCRIBE_CONFIGS on topic {topic!r}"
            elif topic not in known or self._topic_configs is None:
                result.error_code = pb.UNKNOWN_TOPIC_OR_PARTITION
                result.error_message = f"topic {topic!r} does not exist"
            else:
                result.configs.extend(pb.DescribedConfig(name=n, value=v, source=source)
                                      for n, v, source in self._topic_configs(topic))
        return response

    @_rpc("DeleteRecords")
    async def DeleteRecords(self, request: pb.DeleteRecordsRequest, context: Context
                           ) -> pb.DeleteRecordsResponse:
        """Kafka's DeleteRecords (``serving/delete_records.py``), DELETE on each topic
        needed (TOPIC_AUTHORIZATION_FAILED) when an authorizer is on."""
        allowed = await self._allowed(context)
        wanted = [(p.topic, p.partition, p.offset) for p in request.partitions
                  if allowed is None or allowed(DELETE, p.topic)]
        response = pb.DeleteRecordsResponse()
        for p in request.partitions:
            if allowed is not None and not allowed(DELETE, p.topic):
                response.partitions.add(topic=p.topic, partition=p.partition, low_watermark=-1,
                                        error_code=pb.TOPIC_AUTHORIZATION_FAILED,
                                        error_message=f"needs DELETE on topic {p.topic!r}")
        for r in await self.replica_manager.delete_records(wanted, request.timeout_ms):
            response.partitions.add(topic=r.topic, partition=r.partition,
                                    low_watermark=r.low_watermark, error_code=r.error_code,
                                    error_message=r.error_message)
        return response

    @_rpc("InitProducerId")
    async def InitProducerId(self, request: pb.InitProducerIdRequest, context: Context
                            ) -> pb.InitProducerIdResponse:
        if request.transactional_id:  # the transaction coordinator's (WRITE on the id)
            return await self.txns.init_producer_id(request, await self._rights(context))
        security = self.security
        if security is not None:
            session = await self._session(context, security)
            if not may_init_producer_id(
                    lambda op, kind, name: security.allows(session, op, kind, name),
                    lambda op, kind: security.allows_any(session, op, kind)):
                return pb.InitProducerIdResponse(
                    error_code=pb.CLUSTER_AUTHORIZATION_FAILED, producer_id=-1,
                    producer_epoch=-1, error_message="needs IDEMPOTENT_WRITE on the cluster "
                                                     "or WRITE on some topic")
        return await self.replica_manager.init_producer_id(request)

    # Consumer groups: broker/group/grpc_service.py (the same coordinator as Kafka's APIs).
    @_rpc("FindCoordinator")
    async def FindCoordinator(self, request: pb.FindCoordinatorRequest, context: Context
                             ) -> pb.FindCoordinatorResponse:
        if request.key_type == pb.KEY_TYPE_TRANSACTION:
            return await self.txns.find_coordinator(request, await self._rights(context))
        if request.key_type != pb.KEY_TYPE_GROUP:
            return pb.FindCoordinatorResponse(
                error_code=pb.INVALID_REQUEST,
                error_message=f"unknown coordinator key type {request.key_type}")
        return await self.groups.find_coordinator(request, await self._group_allowed(context))

    @_rpc("JoinGroup")
    async def JoinGroup(self, request: pb.JoinGroupRequest, context: Context
                       ) -> pb.JoinGroupResponse:
        client_host = "/" + grpc_auth.peer_host(context.peer() or "")  # as Kafka shows it
        return await self.groups.join_group(request, await self._group_allowed(context),
                                            client_host=client_host)

    @_rpc("SyncGroup")
    async def SyncGroup(self, request: pb.SyncGroupRequest, context: Context
                       ) -> pb.SyncGroupResponse:
        return await self.groups.sync_group(request, await self._group_allowed(context))

    @_rpc("Heartbeat")
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Context
                       ) -> pb.HeartbeatResponse:
        return await self.groups.heartbeat(request, await self._group_allowed(context))

    @_rpc("LeaveGroup")
    async def LeaveGroup(self, request: pb.LeaveGroupRequest, context: Context
                        ) -> pb.LeaveGroupResponse:
        return await self.groups.leave_group(request, await self._group_allowed(context))

    @_rpc("OffsetCommit")
    async def OffsetCommit(self, request: pb.OffsetCommitRequest, context: Context
                          ) -> pb.OffsetCommitResponse:
        rights = await self._rights(context)
        return await self.groups.offset_commit(request, *_group_and_topic(rights))

    @_rpc("OffsetFetch")
    async def OffsetFetch(self, request: pb.OffsetFetchRequest, context: Context
                         ) -> pb.OffsetFetchResponse:
        rights = await self._rights(context)
        return await self.groups.offset_fetch(request, *_group_and_topic(rights))

    @_rpc("ListGroups")
    async def ListGroups(self, request: pb.ListGroupsRequest, context: Context
                        ) -> pb.ListGroupsResponse:
        return await self.groups.list_groups(request, await self._group_allowed(context))

    @_rpc("DescribeGroups")
    async def DescribeGroups(self, request: pb.DescribeGroupsRequest, context: Context
                            ) -> pb.DescribeGroupsResponse:
        return await self.groups.describe_groups(request, await self._group_allowed(context))

    @_rpc("DeleteGroups")
    async def DeleteGroups(self, request: pb.DeleteGroupsRequest, context: Context
                          ) -> pb.DeleteGroupsResponse:
        return await self.groups.delete_groups(request, await self._group_allowed(context))

    @_rpc("OffsetDelete")
    async def OffsetDelete(self, request: pb.OffsetDeleteRequest, context: Context
                          ) -> pb.OffsetDeleteResponse:
        return await self.groups.delete_offsets(request, await self._rights(context))


    # Transactions: broker/txn/grpc_service.py (the Kafka transaction APIs' functions).
    @_rpc("AddPartitionsToTxn")
    async def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest, context: Context
                                 ) -> pb.AddPartitionsToTxnResponse:
        return await self.txns.add_partitions(request, await self._rights(context))

    @_rpc("AddOffsetsToTxn")
    async def AddOffsetsToTxn(self, request: pb.AddOffsetsToTxnRequest, context: Context
                              ) -> pb.AddOffsetsToTxnResponse:
        return await self.txns.add_offsets(request, await self._rights(context))

    @_rpc("TxnOffsetCommit")
    async def TxnOffsetCommit(self, request: pb.TxnOffsetCommitRequest, context: Context
                              ) -> pb.TxnOffsetCommitResponse:
        return await self.txns.txn_offset_commit(request, await self._rights(context))

    @_rpc("EndTxn")
    async def EndTxn(self, request: pb.EndTxnRequest, context: Context) -> pb.EndTxnResponse:
        return await self.txns.end_txn(request, await self._rights(context))

    @_rpc("ListTransactions")
    async def ListTransactions(self, request: pb.ListTransactionsRequest, context: Context
                               ) -> pb.ListTransactionsResponse:
        return self.txns.list_transactions(self.replica_manager.broker_id,
                                           await self._rights(context))


class BrokerControlServicer(_Servicer, pb_grpc.BrokerControlServicer):
    """Cluster members' calls; on the INTERNAL listener only. ``authenticating``: the
    listener requires client certificates (TLS), and each call must come from the
    principal ``control_principal_refusal`` allows; refused calls change nothing."""

    def __init__(self, replica_manager: ReplicaManager, metrics: BrokerMetrics, *,
                 authenticating: bool = False, security: BrokerSecurity | None = None,
                 coordinators: Coordinators | None = None) -> None:
        super().__init__(replica_manager, metrics)
        self.authenticating = authenticating
        self.coordinators = coordinators  # VerifyTxnPartitions (KIP-890)
        # SASL or an authorizer: a follower fetch also needs an authenticated caller with
        # CLUSTER_ACTION (``inter_broker``), whatever the transport.
        self.security = security if security is not None and security.secured else None

    def _refusal(self, rpc: str, context: Context, replica_id: int | None = None
                 ) -> int | None:
        if not self.authenticating:
            return None
        return control_principal_refusal(rpc, _principal(context),
                                         authenticating=True, replica_id=replica_id)

    @_rpc("LeaderAndIsr")
    async def LeaderAndIsr(self, request: pb.LeaderAndIsrRequest, context: Context
                           ) -> pb.LeaderAndIsrResponse:
        if code := self._refusal("LeaderAndIsr", context):
            return pb.LeaderAndIsrResponse(error_code=wire_code(code))
        return await self.replica_manager.leader_and_isr(request)

    @_rpc("UpdateMetadata")
    async def UpdateMetadata(self, request: pb.UpdateMetadataRequest, context: Context
                             ) -> pb.UpdateMetadataResponse:
        if code := self._refusal("UpdateMetadata", context):
            return pb.UpdateMetadataResponse(error_code=wire_code(code))
        return await self.replica_manager.update_metadata(request)

    @_rpc("StopReplica")
    async def StopReplica(self, request: pb.StopReplicaRequest, context: Context
                          ) -> pb.StopReplicaResponse:
        if code := self._refusal("StopReplica", context):
            return pb.StopReplicaResponse(error_code=wire_code(code))
        return await self.replica_manager.stop_replica(request)

    async def _broker_refusal(self, rpc: str, context: Context) -> int | None:
        """WriteTxnMarkers and VerifyTxnPartitions: from any broker certificate (TLS);
        with SASL or an authorizer only a broker's credentials with CLUSTER_ACTION (the
        follower fetch's rule, ``inter_broker``): markers end other producers'
        transactions, and a verification tells what a transaction holds."""
        code = self._refusal(rpc, context)
        if code is None and self.security is not None:
            try:
                session = await self.security.authenticate_grpc(context)
            except SaslAuthenticationError as e:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                    f"SASL_AUTHENTICATION_FAILED: {e}")
                raise
            if not self.security.may_fetch_as_follower(session):
                code = pb.CLUSTER_AUTHORIZATION_FAILED
        return code

    @_rpc("VerifyTxnPartitions")
    async def VerifyTxnPartitions(self, request: pb.AddPartitionsToTxnRequest,
                                  context: Context) -> pb.AddPartitionsToTxnResponse:
        """A partition leader's KIP-890 verification (``broker/txn/verifier.py``): each
        partition's code from this broker's transaction coordinator."""
        wanted = [(p.topic, p.partition) for p in request.partitions]
        code = await self._broker_refusal("VerifyTxnPartitions", context)
        if code:
            codes = {tp: wire_code(code) for tp in wanted}
        elif self.coordinators is None:
            codes = {tp: pb.NOT_COORDINATOR for tp in wanted}
        else:
            codes = self.coordinators.txn.verify_partitions(
                request.transactional_id, request.producer_id, request.producer_epoch,
                wanted)
        return pb.AddPartitionsToTxnResponse(partitions=[
            pb.TxnPartition(topic=t, partition=p, error_code=c)
            for (t, p), c in codes.items()])

    @_rpc("WriteTxnMarkers")
    async def WriteTxnMarkers(self, request: pb.WriteTxnMarkersRequest, context: Context
                              ) -> pb.WriteTxnMarkersResponse:
        """A transaction coordinator's markers (``serving/txn_markers.py``), per partition."""
        code = await self._broker_refusal("WriteTxnMarkers", context)
        if code:
            return results_to_proto([
                TxnMarkerResult(m.producer_id, p.topic, p.partition, code)
                for m in request.markers for p in m.partitions])
        results = await self.replica_manager.txn_markers.write_txn_markers(
            markers_from_proto(request), timeout_ms=request.timeout_ms)
        return results_to_proto(results)

    async def ReplicaFetch(self, request_iterator: AsyncIterator[pb.FetchRequest],
                           context: grpc.aio.ServicerContext[pb.FetchRequest, bytes]) -> None:
        """Follower fetches on one long-lived stream: each request answered once, in order.

        Requests are handled one at a time (a follower sends the next only after the
        answer); a follower that must stop a long-poll early cancels the stream, which
        cancels the pending fetch here. Reading the next request ahead, to let its
        arrival cut a long-poll short, cost ~0.1 ms of CPU per round trip (measured
        with a ping-pong microbenchmark), for an event as rare as a LeaderAndIsr.
        An exception escaping a fetch is answered as a request-level error, as for Fetch.
        Answers are written as FetchResponse wire bytes (``fetch_wire``: the records
        joined in once, not copied through a protobuf message); ``build_server`` registers
        this method without protobuf's serializer. The stream holds the follower's fetch
        session (``replica_fetch_session``): incremental requests and answers.
        """
        # The peer's certificate, read once per stream (no principals without TLS).
        principal = _principal(context) if self.authenticating else None
        security = self.security
        session: Session | None = None
        if security is not None:
            # Credentials travel once per stream (call metadata); a refused caller gets
            # nothing, not even a fetch answer.
            try:
                session = await security.authenticate_grpc(context)
            except SaslAuthenticationError as e:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                    f"SASL_AUTHENTICATION_FAILED: {e}")

        def refusal(replica_id: int) -> int | None:
            code = control_principal_refusal("ReplicaFetch", principal,
                                             authenticating=self.authenticating,
                                             replica_id=replica_id)
            if code is None and security is not None and session is not None \
                    and not security.may_fetch_as_follower(session):
                # Checked per request: a revoked ACL ends a running stream's fetches.
                return pb.CLUSTER_AUTHORIZATION_FAILED
            return code
        replica_manager = self.replica_manager
        fetch_session = replica_manager.replica_fetch_session()  # the stream's
        by_mode = self.metrics.replica_fetch_requests
        sessionless = by_mode.labels("sessionless")
        counted = {pb.SESSION_FULL: by_mode.labels("full"),
                   pb.SESSION_INCREMENTAL: by_mode.labels("incremental")}

        async def answer(request: pb.FetchRequest) -> bytes:
            counted.get(request.session_mode, sessionless).inc()
            if not fetch_session.take(request):
                return encode_fetch_response(await replica_manager.fetch_partitions(request))
            results = await replica_manager.fetch_partitions(request, fetch_session)
            return encode_fetch_response(fetch_session.answer(results), session_held=True)
        try:
            await self._fetch_stream(context, "ReplicaFetch", refusal, answer,
                                     _fetch_error_bytes)
        finally:
            fetch_session.close()  # it stops listening to its partitions


class _StreamReader(Generic[_Request]):
    """Reads a stream's next request, unless the broker is shutting down.

    A stream waiting for its client's next request would hold the servers' grace
    period at shutdown; ``ReplicaManager.answer_long_polls`` calls ``_on_closing``,
    which cancels the read in progress (only the read: the handler goes on to send
    its pending answers and ends the stream with OK). ``read`` gives None at EOF
    and once the broker is closing."""

    def __init__(self, context: grpc.aio.ServicerContext[_Request, Any],
                 replica_manager: ReplicaManager) -> None:
        self._context = context
        task = asyncio.current_task()
        assert task is not None  # made in the handler's own task
        self._task = task
        self._reading = False
        self._stopped = replica_manager.closing
        self._remove = replica_manager.on_closing(self._on_closing)

    def _on_closing(self) -> None:
        self._stopped = True
        if self._reading:
            self._task.cancel()

    async def read(self) -> _Request | None:
        if self._stopped:
            return None
        self._reading = True
        try:
            request = await self._context.read()
        except asyncio.CancelledError:
            if not self._stopped:
                raise  # the client cancelled the call
            self._task.uncancel()
            return None
        finally:
            self._reading = False
        return None if _is_eof(request) else request

    def close(self) -> None:
        self._remove()


def _produce_refusals(request: pb.ProduceRequest, rights: Callable[[int, int, str], bool]
                      ) -> list[pb.ProducePartitionResponse]:
    """The partitions the caller may not write, taken out of ``request``: all of them
    when it names a transactional id the caller may not WRITE (Kafka's rule for a
    transactional produce), else those of topics it may not WRITE."""
    transactional_id = request.transactional_id
    if transactional_id and not rights(WRITE, TRANSACTIONAL_ID, transactional_id):
        denied = [pb.ProducePartitionResponse(
            topic=p.topic, partition=p.partition,
            error_code=pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            error_message=f"needs WRITE on transactional id {transactional_id!r}",
            base_offset=-1, log_start_offset=-1) for p in request.partitions]
        del request.partitions[:]
        return denied
    return grpc_auth.produce_refusals(
        request, lambda operation, topic: rights(operation, TOPIC, topic))


def _is_eof(read: object) -> bool:
    """``context.read()`` gave grpc.aio's EOF (grpc-stubs type it as a request only)."""
    return read is grpc.aio.EOF


def _principal(context: Context) -> Principal | None:
    """The caller's certificate principal (``proto.tls.principal_of``), as the controller
    reads it: grpc-stubs type the values of ``auth_context()`` as iterables."""
    return principal_of({k: list(v) for k, v in context.auth_context().items()})


class _AnswerWriter:
    """A stream's answers, one ``context.write`` at a time (grpc.aio allows one in flight).

    ``write`` sends now, from the handler (acks=1 answers). ``send_later`` is for answers
    completed by a callback (acks=all): they queue and one task, started at the first,
    writes them in order. A failed queued write is logged and dropped: the stream is gone
    and the client resends what was not answered."""

    def __init__(self, context: grpc.aio.ServicerContext[pb.ProduceRequest, pb.ProduceResponse],
                 observe: Callable[[float], None], supervisor: TaskSupervisor) -> None:
        self._context = context
        self._supervisor = supervisor  # runs the writing task: a bug there stops the broker
        self._observe = observe
        self._lock = asyncio.Lock()
        self._queue: collections.deque[tuple[pb.ProduceResponse, float]] = collections.deque()
        self._unwritten = 0  # sent later and not written yet (queued or being written)
        self._wakeup: asyncio.Future[None] | None = None  # the task waits for send_later on this
        self._idle: asyncio.Future[None] | None = None  # idle() waits on this
        self._task: asyncio.Task[None] | None = None

    async def write(self, response: pb.ProduceResponse, started: float) -> None:
        async with self._lock:
            await self._context.write(response)
        self._observe(time.perf_counter() - started)

    def send_later(self, response: pb.ProduceResponse, started: float) -> None:
        self._queue.append((response, started))
        self._unwritten += 1
        if self._task is None:
            self._task = self._supervisor.spawn(self._run(), "produce-stream-answers")
        elif self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self._queue:
                response, started = self._queue.popleft()
                try:
                    await self.write(response, started)
                except Exception as e:  # the stream is gone; the client resends
                    log.debug("ProduceStream answer not sent: %r", e)
                self._unwritten -= 1
                if self._idle is not None and not self._idle.done():
                    self._idle.set_result(None)
            self._wakeup = loop.create_future()
            await self._wakeup
            self._wakeup = None

    async def idle(self) -> None:
        """Until the next queued answer is written (the caller checks what it waits for)."""
        self._idle = asyncio.get_running_loop().create_future()
        try:
            await self._idle
        finally:
            self._idle = None

    async def drain(self) -> None:
        """Until every answer given to ``send_later`` is written."""
        while self._unwritten:
            await self.idle()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _group_and_topic(rights: Callable[[int, int, str], bool] | None
                     ) -> tuple[GroupAllowed | None, GroupAllowed | None]:
    """(operation, group) -> may and (operation, topic) -> may, of one caller's rights."""
    if rights is None:
        return None, None
    return (lambda op, group: rights(op, GROUP, group)), (lambda op, topic: rights(op, TOPIC, topic))


def build_server(*, host: str, port: int, servicer: BrokerServicer,
                 controller_servicer: pb_grpc.ControllerServicer,
                 max_message_bytes: int,
                 control_servicer: BrokerControlServicer | None = None,
                 credentials: grpc.ServerCredentials | None = None,
                 sasl_servicer: pb_grpc.SaslServicer | None = None,
                 limits: GrpcLimits | None = None,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
                 ) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server for one listener; returns it (not started) and its bound port.
    ``control_servicer``: the INTERNAL listener's ``BrokerControl`` (None elsewhere).
    ``credentials``: TLS (``proto.tls.server_credentials``); None: plaintext.
    ``sasl_servicer``: SCRAM over gRPC (``servicers.sasl``).
    ``limits``: what one connection may hold (``servicers.grpc_limits``).
    ``interceptors``: e.g. ``security.stream_expiry`` (streams end with their session)."""
    tune_malloc_for_large_buffers()  # requests and responses carry MiB-sized buffers
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        *(limits or GrpcLimits()).options(),
    ], interceptors=list(interceptors))
    pb_grpc.add_BrokerServicer_to_server(servicer, server)
    pb_grpc.add_ControllerServicer_to_server(controller_servicer, server)
    if control_servicer is not None:
        _add_broker_control(control_servicer, server)
    if sasl_servicer is not None:
        pb_grpc.add_SaslServicer_to_server(sasl_servicer, server)
    try:
        if credentials is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError as e:  # grpc's way of saying the address is taken or invalid
        raise OSError(f"cannot listen on {host}:{port}: {e}") from None
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    return server, bound


class _MethodHandlers:
    """Stands in for the server while generated code registers a service: keeps the
    handlers it builds, for ``_add_broker_control`` to change one before registering."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # built again from ``handlers`` by the caller

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
                                       ) -> None:
        self.service, self.handlers = service, dict(handlers)


def _add_broker_control(servicer: BrokerControlServicer, server: grpc.aio.Server) -> None:
    """``BrokerControl`` as generated, except that ReplicaFetch's answers are written as
    the wire bytes its handler encodes (``fetch_wire``), without protobuf's serializer."""
    generated = _MethodHandlers()
    pb_grpc.add_BrokerControlServicer_to_server(servicer, generated)
    handlers = generated.handlers
    replica_fetch = handlers["ReplicaFetch"]
    assert replica_fetch.stream_stream is not None  # a stream-stream method
    handlers["ReplicaFetch"] = grpc.stream_stream_rpc_method_handler(
        replica_fetch.stream_stream, request_deserializer=replica_fetch.request_deserializer,
        response_serializer=None)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(generated.service, handlers),))
    server.add_registered_method_handlers(generated.service, handlers)
