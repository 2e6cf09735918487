"""The gRPC ``Controller`` service, and the contract brokers follow with it.

Broker <-> controller contract (details this controller decides)
------------------------------------------------------------------
* **RegisterBroker** every time the broker process starts, with a new
  ``incarnation_id`` (e.g. a uuid4) and its listeners (``INTERNAL`` is where
  the controller and other brokers reach it; ``EXTERNAL`` is optional). The
  answer's ``broker_epoch`` (the registration record's offset in the metadata
  log: it only grows, also across controller restarts) goes into every later
  heartbeat, AlterPartition and replica fetch. A registration is accepted at
  once unless another incarnation of the same id still holds its session:
  that is DUPLICATE_BROKER_REGISTRATION and changes nothing (the broker retries
  for two session timeouts, then exits). If the incarnation differs from the
  registered one (whose session ended), the broker is first removed from every
  ISR it is not the last member of and from leadership (it may have lost
  unflushed data), then re-admitted. INVALID_REQUEST: negative id, empty
  incarnation id, no listeners, a bad host/port, repeated listener names.
* **BrokerHeartbeats**: a heartbeat every ``broker.heartbeat.interval.ms`` (500 ms
  suggested); ``broker.session.timeout.ms`` (default 3000) without one fences
  the broker: it leaves every ISR it is not the last member of, its
  leaderships move (leader_epoch + 1) and it receives nothing more.
  ``STALE_BROKER_EPOCH`` answers mean "unknown broker or old epoch": register
  again (new incarnation not needed) and use the new epoch. A heartbeat with
  the current epoch from a fenced broker unfences it; it then gets a full
  resync (LeaderAndIsr for every partition it hosts + UpdateMetadata), and an
  offline partition it can lead elects it.
  Heartbeats travel on one bidirectional stream per broker incarnation, each
  request answered in order (there is no unary heartbeat). The stream
  ending while it is the broker's live one (it carried the latest heartbeat
  of the broker's current epoch, and no controlled shutdown finished) fences
  the broker at once, through the same path as a session expiry (same
  metadata record and elections; metric ``brokers_fenced{reason=
  "heartbeat_stream_closed"}``): a SIGKILLed broker's kernel closes its TCP
  connection, so its leaderships move in milliseconds instead of after
  ``broker.session.timeout.ms``. There is no grace period: a live broker whose
  stream broke (a network blip) re-opens it and its next heartbeat unfences
  it; that costs a leader change, never data. A paused or partitioned broker
  keeps its connection, so the session timeout still detects those. When the
  controller itself stops, it ends every stream without fencing anyone (see
  ``close_streams``); the brokers reconnect to its successor.
* **Controlled shutdown**: heartbeat with ``want_shutdown=true`` (keep the
  interval) until ``should_shutdown`` is true. The controller moves every
  leadership away and drops the broker from ISRs; a partition whose only live
  ISR member is this broker goes offline (or, when the topic allows unclean
  elections, gets a live out-of-sync replica as leader, as in Kafka). Then
  the broker exits; its session expiring afterwards changes nothing.
* **Controller restart**: the controller bumps its epoch, replays its log and
  gives every broker that was unfenced a fresh session, one session timeout from
  the moment it became active (a broker reconnects within about a heartbeat
  interval plus its channel's 1 s reconnect backoff cap). Heartbeats with the
  broker's current epoch keep working; the controller resyncs every unfenced
  broker (full LeaderAndIsr with the new controller epoch + UpdateMetadata).
  Brokers must accept a higher controller epoch and refuse a lower one with
  STALE_CONTROLLER_EPOCH.
* **AlterPartition**: top-level STALE_BROKER_EPOCH when the sender's epoch is
  not current or it is fenced. Per item: FENCED_LEADER_EPOCH (leader epoch is
  not the current one), NOT_LEADER_OR_FOLLOWER (sender is not the leader),
  INVALID_UPDATE_VERSION (partition epoch is stale), INVALID_REQUEST (ISR
  lacks the leader or repeats a member), INELIGIBLE_REPLICA (a member is not a
  replica, or a joining member is not live), UNKNOWN_TOPIC_OR_PARTITION. The
  item's ``state`` is the committed state on success and the current state on
  error. When the change brings the preferred replica back into the ISR the
  controller moves leadership to it right after (a separate LeaderAndIsr).
* **ReportCorruptReplica**: a broker whose own replica holds a batch failing
  its CRC reports it with the partition's leader and partition epochs as it
  knows them. Top-level STALE_BROKER_EPOCH as AlterPartition. Per replica
  (``election.on_replica_corrupt``): it leaves the ISR and, if it leads, the
  first live ISR member in replica order leads (clean only); refusals change
  nothing and are listed in tidewater.proto. The result's ``state`` is the
  committed state on success and the current one on error. Then the usual
  LeaderAndIsr goes to the partition's replicas.
* Pushes (broker's ``Broker`` service, INTERNAL listener): LeaderAndIsr for a
  partition goes to all its unfenced replicas whenever it changes;
  ``is_new`` marks partitions of a topic created in the same change. Every
  committed change also sends a full UpdateMetadata to every unfenced broker.
  DeleteTopics sends StopReplica(delete_partitions=true) to the replicas that
  are unfenced; a replica fenced at the time gets it when it is unfenced or
  registers again (durably remembered; leader_epoch -1 in those states). A
  broker should still treat local logs absent from a full snapshot as stray.
* **Mutual TLS** (controller started with ``--tls-*``): RegisterBroker,
  BrokerHeartbeats, AlterPartition and ReportCorruptReplica are taken only
  from the certificate ``CN=broker-<id>, OU=broker`` of the broker id they
  name (``authorization.broker_request_refusal``); others are answered
  CLUSTER_AUTHORIZATION_FAILED (with the reason in ``error_message`` where the
  response has one) and change nothing.
* **SASL and ACLs** (controller started with ``--sasl-mechanisms`` or
  ``--authorizer acl``): ``access.ControllerGuard`` authenticates every call and
  takes the broker calls above only with CLUSTER_ACTION on the cluster, admin
  calls only with Kafka's operations for them (checked as the client a broker
  forwards for).
* CreateTopics and DeleteTopics answer once the change is durable AND every
  unfenced broker acknowledged the resulting LeaderAndIsr / StopReplica /
  UpdateMetadata, waiting at most min(timeout_ms, 5000) ms (0: no wait); after
  that wait they answer NONE anyway (the change is committed), so clients
  should still retry NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC briefly.
  They are answered by their ``timeout_ms`` (``DEFAULT_TIMEOUT_MS`` when it is
  0), as Kafka's controller answers by the request's deadline, and within the
  forwarding broker's gRPC deadline: a change not committed by then (still
  queued behind other commands, or its Raft commit late) is answered
  REQUEST_TIMED_OUT per topic. One still queued is then dropped; one already
  proposed may commit later, as in Kafka, so a client's retry may find
  TOPIC_ALREADY_EXISTS. With timeout_ms 0 (Kafka's "do not wait": librdkafka
  takes REQUEST_TIMED_OUT as "creation under way") nothing is dropped.
  Every topic gets ``min.insync.replicas`` in its configs (cluster default
  unless given).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from tidewater.controller.authorization import (
    MEMBER_ONLY_ADMIN_RPCS,
    admin_request_refusal,
    broker_request_refusal,
    refusal_message,
)
from tidewater.controller.metrics import ControllerMetrics
from tidewater.controller.owner import Command, MetadataOwner, OwnerStoppedError
from tidewater.controller.quorum.config import static_directory_id
from tidewater.controller.quorum.owner import LEADER_HINT_KEY, NotActiveError, QuorumOwner
from tidewater.controller.quorum.service import describe_response
from tidewater.controller.sender import BrokerSenders
from tidewater.controller.state_machine import ControllerStateMachine, Tx
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import InvariantViolation, RequestTimedOutError, TidewaterError
from tidewater.proto.supervisor import TaskSupervisor
from tidewater.proto.tls import Principal, principal_of

log = logging.getLogger(__name__)

T = TypeVar("T")
TopicsRequest = TypeVar("TopicsRequest", pb.CreateTopicsRequest, pb.CreatePartitionsRequest,
                        pb.DeleteTopicsRequest)
TopicsResponse = TypeVar("TopicsResponse", pb.CreateTopicsResponse, pb.CreatePartitionsResponse,
                         pb.DeleteTopicsResponse)
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]  # of any handler
# A topic change's deadline when its timeout_ms is 0 (the forwarding broker's margin).
DEFAULT_TIMEOUT_MS = 5000
# Of the forwarding broker's gRPC deadline, what is kept back so that our
# REQUEST_TIMED_OUT reaches it before its own deadline passes.
ANSWER_MARGIN_S = 0.5


def _retrieved(task: asyncio.Future[Any]) -> None:
    """A command left running after its caller was answered: its outcome is nobody's."""
    if not task.cancelled():
        task.exception()


def deadline_budget_s(timeout_ms: int, grpc_remaining_s: float | None) -> float:
    """How long a topic change may take before it is answered REQUEST_TIMED_OUT."""
    budget_s = (timeout_ms if timeout_ms > 0 else DEFAULT_TIMEOUT_MS) / 1000
    if grpc_remaining_s is not None:
        budget_s = min(budget_s, grpc_remaining_s - min(ANSWER_MARGIN_S, grpc_remaining_s / 10))
    return max(budget_s, 0.0)


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(self, owner: MetadataOwner | QuorumOwner, machine: ControllerStateMachine,
                 metrics: ControllerMetrics, senders: BrokerSenders | None = None,
                 propagation_wait_ms_max: int = 5000, *, supervisor: TaskSupervisor,
                 authenticating: bool = False):
        """``authenticating``: the listener requires client certificates (TLS); brokers'
        requests are then taken only from their own certificate (``authorization``)."""
        self.owner = owner
        self.supervisor = supervisor  # runs the fencing after a stream ends
        self.authenticating = authenticating
        self.machine = machine
        self.metrics = metrics
        self.senders = senders
        self.propagation_wait_ms_max = propagation_wait_ms_max
        self._stream_ids = itertools.count(1)
        self._streams: set[asyncio.Task[Any]] = set()  # handlers of open BrokerHeartbeats streams
        self._closing = asyncio.Event()  # set by close_streams

    async def _wait_propagated(self, offset: int, timeout_ms: int) -> None:
        """Give brokers the change before answering, so clients find the topic at once."""
        wait_ms = min(timeout_ms, self.propagation_wait_ms_max)
        if self.senders is None or wait_ms <= 0:
            return
        if not await self.senders.wait_synced(offset, wait_ms / 1000):
            log.info("change at offset %d not yet delivered to every broker after %d ms",
                     offset, wait_ms)

    async def _run(self, rpc: str, command: Command[T], context: Context,
                   timeout_s: float | None = None, *, keep_late: bool = False) -> T:
        """``command`` through the owner. ``timeout_s``: the caller answers by then; a
        command not done by then raises ``RequestTimedOutError`` here (the caller answers
        it per item): still queued, it is dropped (Kafka drops an event whose deadline
        passed), unless ``keep_late``; already running, it finishes unseen."""
        # The principal is read only for the calls the rule is about (auth_context is
        # parsed per call): AlterPartition and the like pass through _run too.
        if rpc in MEMBER_ONLY_ADMIN_RPCS and admin_request_refusal(
                self._principal(context), rpc, authenticating=self.authenticating) is not None:
            log.warning("%s refused: a client certificate sent it to the controller's port; "
                        "clients reach it through a broker, which checks their ACLs", rpc)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"CLUSTER_AUTHORIZATION_FAILED: {rpc} is taken from cluster "
                                "members only; send it to a broker")
        with self.metrics.time_rpc(rpc):
            try:
                if timeout_s is None:
                    return await self.owner.submit(command)
                # Cancelling the wait cancels the command's future: the owner skips it if
                # it has not started. Shielded, it runs all the same, unawaited.
                work: Awaitable[T] = self.owner.submit(command)
                if keep_late:
                    running = asyncio.ensure_future(work)
                    running.add_done_callback(_retrieved)
                    work = asyncio.shield(running)
                try:
                    async with asyncio.timeout(timeout_s):
                        return await work
                except TimeoutError:
                    raise RequestTimedOutError(
                        f"{rpc} not done within {timeout_s * 1000:.0f} ms (the active "
                        "controller busy, or its quorum slow to commit); it may still "
                        "complete") from None
            except NotActiveError as e:
                # A standby of the quorum: the broker tries the controller it names next.
                context.set_trailing_metadata(((LEADER_HINT_KEY, str(e.leader_id)),))
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            except OwnerStoppedError as e:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            except RequestTimedOutError as e:
                if timeout_s is not None:
                    raise  # answered per item by the caller
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{e.error_name}: {e}")
            except TidewaterError as e:
                # Request-level typed errors have no per-message error field
                # everywhere; INVALID_ARGUMENT carries the message.
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"{e.error_name}: {e}")

    def _principal(self, context: Context) -> Principal | None:
        if not self.authenticating:
            return None
        return principal_of({k: list(v) for k, v in context.auth_context().items()})

    def _refusal(self, principal: Principal | None, broker_id: int,
                 rpc: str) -> pb.ErrorCode | None:
        code = broker_request_refusal(principal, broker_id, authenticating=self.authenticating)
        if code is not None:
            log.warning("%s refused: %s", rpc, refusal_message(principal, broker_id))
        return code

    async def RegisterBroker(self, request: pb.RegisterBrokerRequest,
                             context: Context) -> pb.RegisterBrokerResponse:
        principal = self._principal(context)
        if code := self._refusal(principal, request.broker_id, "RegisterBroker"):
            return pb.RegisterBrokerResponse(
                error_code=code, error_message=refusal_message(principal, request.broker_id))
        response = await self._run("RegisterBroker", lambda tx, now: (
            self.machine.register_broker(tx, now, request)), context)
        if response.error_code == pb.NONE:
            log.info("broker %d registered (incarnation %s) with epoch %d: %s",
                     request.broker_id, request.incarnation_id, response.broker_epoch,
                     ", ".join(f"{x.name}={x.host}:{x.port}" for x in request.listeners))
        return response

    async def BrokerHeartbeats(self, request_iterator: AsyncIterator[pb.BrokerHeartbeatRequest],
                               context: Context) -> None:
        if self._closing.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the controller is shutting down")
        stream_id = next(self._stream_ids)
        principal = self._principal(context)  # read once per stream
        bound: tuple[int, int] | None = None  # (broker id, epoch) of the last accepted heartbeat
        task = asyncio.current_task()
        if task is None:
            raise InvariantViolation("BrokerHeartbeats outside a task (grpc.aio runs each in one)")
        self._streams.add(task)
        requests = aiter(request_iterator)
        # Not background tasks: this handler's children, awaited below and cancelled in
        # its finally; what they raise is raised here (read.result()).
        closing = asyncio.ensure_future(self._closing.wait())
        read: asyncio.Future[pb.BrokerHeartbeatRequest | None] | None = None
        try:
            while True:
                read = asyncio.ensure_future(anext(requests, None))
                await asyncio.wait((read, closing), return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    # The controller stops: finish with OK now (the broker reads the end
                    # and re-opens to the next controller) instead of leaving the broker
                    # waiting for an answer until the server's grace period ends.
                    return
                request = read.result()
                if request is None:  # the broker half-closed (after a controlled shutdown)
                    return
                if code := self._refusal(principal, request.broker_id, "BrokerHeartbeats"):
                    # Never bound: the end of this stream fences nobody.
                    await context.write(pb.BrokerHeartbeatResponse(error_code=code))
                    continue

                # The session counts from the heartbeat's arrival, not from when the owner
                # runs it: behind a slow commit (a quorum's round trip on a loaded host)
                # heartbeats queue up, and the session timer's check queued among them
                # would fence brokers whose heartbeats are waiting in line.
                self.machine.note_heartbeat(request, stream_id, self.owner.now_ms())

                def heartbeat(tx: Tx, now_ms: int, r: pb.BrokerHeartbeatRequest = request,
                              ) -> tuple[bool, pb.BrokerHeartbeatResponse]:
                    return (self._is_fenced(r.broker_id),
                            self.machine.broker_heartbeat(tx, now_ms, r, stream_id))

                was_fenced, response = await self._run("BrokerHeartbeats", heartbeat, context)
                if response.error_code == pb.NONE:
                    bound = (request.broker_id, request.broker_epoch)
                    if was_fenced and not response.is_fenced:
                        # After a stream that broke while the broker lived (a blip), or a pause.
                        log.info("broker %d unfenced: heartbeating again (stream %d)",
                                 request.broker_id, stream_id)
                await context.write(response)
        finally:
            closing.cancel()
            if read is not None and not read.done():
                read.cancel()
            self._streams.discard(task)
            if bound is not None and not self._closing.is_set():
                # Shielded: a cancelled handler (lost connection) must still fence; and
                # supervised, since then nobody would see what it raises.
                await asyncio.shield(self.supervisor.spawn(
                    self._stream_closed(*bound, stream_id), f"stream-closed-{stream_id}"))

    def _is_fenced(self, broker_id: int) -> bool:
        broker = self.machine.metadata.brokers.get(broker_id)
        return broker is not None and broker.fenced

    async def _stream_closed(self, broker_id: int, broker_epoch: int, stream_id: int) -> None:
        try:
            fenced = await self.owner.submit(lambda tx, now: self.machine.heartbeat_stream_closed(
                tx, now, broker_id, broker_epoch, stream_id))
        except OwnerStoppedError:
            return
        except RequestTimedOutError as e:
            # Not committed in time (a slow quorum); if it never does, the broker's
            # session runs out and the session check fences it.
            log.warning("fencing broker %d after its stream closed not committed in time: %s",
                        broker_id, e)
            return
        if fenced:
            self.metrics.brokers_fenced.labels("heartbeat_stream_closed").inc()
            log.warning("broker %d fenced: heartbeat stream closed (broker epoch %d)",
                        broker_id, broker_epoch)

    async def close_streams(self, timeout_s: float = 1.0) -> None:
        """The controller is stopping: end every heartbeat stream without fencing anyone."""
        self._closing.set()
        streams = list(self._streams)
        if not streams:
            return
        _, late = await asyncio.wait(streams, timeout=timeout_s)
        for task in late:  # stuck in a heartbeat: the server's stop cancels its RPC
            log.warning("heartbeat stream handler %s did not finish in %.1f s", task.get_name(),
                        timeout_s)

    async def AlterPartition(self, request: pb.AlterPartitionRequest,
                             context: Context) -> pb.AlterPartitionResponse:
        if code := self._refusal(self._principal(context), request.broker_id, "AlterPartition"):
            return pb.AlterPartitionResponse(error_code=code)
        return await self._run("AlterPartition", lambda tx, now: (
            self.machine.alter_partition(tx, now, request)), context)

    async def ReportCorruptReplica(self, request: pb.ReportCorruptReplicaRequest,
                                   context: Context) -> pb.ReportCorruptReplicaResponse:
        if code := self._refusal(self._principal(context), request.broker_id,
                                 "ReportCorruptReplica"):
            return pb.ReportCorruptReplicaResponse(error_code=code)
        response = await self._run("ReportCorruptReplica", lambda tx, now: (
            self.machine.report_corrupt_replica(tx, now, request)), context)
        for item, result in zip(request.replicas, response.results, strict=False):
            error = pb.ErrorCode.Name(result.error_code)
            self.metrics.corrupt_replica_reports.labels(error).inc()
            log.warning("broker %d reports a batch failing its CRC in its replica of %s-%d "
                        "(offset %d): %s%s", request.broker_id, item.topic, item.partition,
                        item.corrupt_offset,
                        "left the ISR" if result.error_code == pb.NONE else error,
                        f", leader {result.state.leader} in epoch {result.state.leader_epoch}"
                        if result.error_code == pb.NONE else "")
        return response

    async def AllocateProducerIds(self, request: pb.AllocateProducerIdsRequest,
                                  context: Context) -> pb.AllocateProducerIdsResponse:
        if code := self._refusal(self._principal(context), request.broker_id,
                                 "AllocateProducerIds"):
            return pb.AllocateProducerIdsResponse(error_code=code)
        response = await self._run("AllocateProducerIds", lambda tx, now: (
            self.machine.allocate_producer_ids(tx, now, request)), context)
        if response.error_code == pb.NONE:
            log.info("producer ids %d..%d to broker %d", response.producer_id_start,
                     response.producer_id_start + response.producer_id_len - 1,
                     request.broker_id)
        return response

    async def _change_topics(self, kind: str, command: Callable[[Tx, int, TopicsRequest],
                                                                TopicsResponse],
                             request: TopicsRequest, context: Context,
                             describe: Callable[[pb.TopicResult], str],
                             answer_type: type[TopicsResponse]) -> TopicsResponse:
        """A CreateTopics-like command (DeleteTopics too): answered once durable and, unless
        validate_only, once the brokers have it (``_wait_propagated``); each change logged.
        Not done by its deadline: REQUEST_TIMED_OUT for every topic."""
        if isinstance(request, pb.DeleteTopicsRequest):
            names, validate_only = list(request.names), False
        else:
            names, validate_only = [t.name for t in request.topics], request.validate_only
        loop = asyncio.get_running_loop()
        budget_s = deadline_budget_s(request.timeout_ms, context.time_remaining())
        deadline = loop.time() + budget_s
        try:
            response, offset = await self._run(kind, lambda tx, now: (
                command(tx, now, request), self.machine.metadata.last_offset), context,
                timeout_s=budget_s, keep_late=request.timeout_ms <= 0)
        except RequestTimedOutError as e:
            log.warning("%s timed out: %s", kind, e)
            return answer_type(topics=[
                pb.TopicResult(name=name, error_code=pb.REQUEST_TIMED_OUT, error_message=str(e),
                               topic_id=getattr(request, "topic_ids", {}).get(name, b""))
                for name in names])
        changed = [t for t in response.topics if t.error_code == pb.NONE]
        if changed and not validate_only:
            left_ms = int((deadline - loop.time()) * 1000)
            await self._wait_propagated(offset, min(request.timeout_ms, left_ms))
            for t in changed:
                log.info("%s", describe(t))
        return response

    async def CreateTopics(self, request: pb.CreateTopicsRequest,
                           context: Context) -> pb.CreateTopicsResponse:
        return await self._change_topics(
            "CreateTopics", self.machine.create_topics, request, context,
            lambda t: f"created topic {t.name}: {t.num_partitions} partitions, replication "
                      f"factor {t.replication_factor}", pb.CreateTopicsResponse)

    async def CreatePartitions(self, request: pb.CreatePartitionsRequest,
                               context: Context) -> pb.CreatePartitionsResponse:
        return await self._change_topics(
            "CreatePartitions", self.machine.create_partitions, request, context,
            lambda t: f"topic {t.name} now has {t.num_partitions} partitions",
            pb.CreatePartitionsResponse)

    async def DeleteTopics(self, request: pb.DeleteTopicsRequest,
                           context: Context) -> pb.DeleteTopicsResponse:
        return await self._change_topics(
            "DeleteTopics", self.machine.delete_topics, request, context,
            lambda t: f"deleted topic {t.name}", pb.DeleteTopicsResponse)

    async def DescribeCluster(self, request: pb.DescribeClusterRequest,
                              context: Context) -> pb.DescribeClusterResponse:
        return await self._run("DescribeCluster", lambda tx, now: (
            self.machine.describe_cluster(tx, now, request)), context)

    async def DescribeQuorum(self, request: pb.DescribeQuorumRequest,
                             context: Context) -> pb.DescribeQuorumResponse:
        """Kafka's DescribeQuorum: the active controller's view of the metadata quorum. A
        standby answers NOT_CONTROLLER with the leader hint (the broker moves on); a
        single controller (no quorum) answers as Kafka's one-voter quorum: itself, leader
        in its controller epoch, its metadata log's end as high watermark."""
        with self.metrics.time_rpc("DescribeQuorum"):
            shell = self.owner.shell if isinstance(self.owner, QuorumOwner) else None
            if shell is None:
                return self._single_voter_quorum()
            answer = describe_response(shell)
            if answer.error_code == pb.NONE and answer.role != "leader":
                hint = shell.leader_hint()
                context.set_trailing_metadata(((LEADER_HINT_KEY, str(hint)),))
                await context.abort(grpc.StatusCode.UNAVAILABLE,
                                    f"NOT_CONTROLLER: controller {shell.config.node_id} is not "
                                    f"the active controller (leader: {hint})")
            return answer

    def _single_voter_quorum(self) -> pb.DescribeQuorumResponse:
        metadata = self.machine.metadata
        node_id = self.machine.config.node_id
        voter = pb.QuorumVoter(id=node_id, directory_id=static_directory_id(node_id))
        end = metadata.last_offset + 1
        return pb.DescribeQuorumResponse(
            local=voter, role="leader", epoch=metadata.controller_epoch, leader_id=node_id,
            high_watermark=end, log_end_offset=end, voters=[voter], applied_offset=end,
            replicas=[pb.QuorumReplicaState(replica=voter, is_voter=True, log_end_offset=end,
                                            lag=0, last_fetch_age_ms=0,
                                            last_caught_up_age_ms=0)],
            cluster_id=metadata.cluster_id)

    async def AlterConfigs(self, request: pb.AlterConfigsRequest,
                           context: Context) -> pb.AlterConfigsResponse:
        """Answered once durable and, when something changed, once the brokers have it
        (a describe or a produce right after sees the new values)."""
        response, offset, changed = await self._run("AlterConfigs", lambda tx, now: (
            self.machine.alter_configs(tx, now, request), self.machine.metadata.last_offset,
            bool(tx.records)), context)
        if changed:
            await self._wait_propagated(offset, self.propagation_wait_ms_max)
        for r in response.results:
            if r.error_code == pb.NONE and not request.validate_only:
                log.info("configs of resource %r (type %d) altered", r.resource_name,
                         r.resource_type)
        return response

    async def ElectLeaders(self, request: pb.ElectLeadersRequest,
                           context: Context) -> pb.ElectLeadersResponse:
        response, offset, changed = await self._run("ElectLeaders", lambda tx, now: (
            self.machine.elect_leaders(tx, now, request), self.machine.metadata.last_offset,
            bool(tx.records)), context)
        if changed:
            await self._wait_propagated(offset, request.timeout_ms)
        return response

    async def AlterPartitionReassignments(self, request: pb.AlterPartitionReassignmentsRequest,
                                          context: Context,
                                          ) -> pb.AlterPartitionReassignmentsResponse:
        """Answered once durable and delivered (the new replicas have their LeaderAndIsr);
        the data moves afterwards: ListPartitionReassignments shows it ongoing."""
        response, offset, changed = await self._run("AlterPartitionReassignments", lambda tx, now: (
            self.machine.alter_partition_reassignments(tx, now, request),
            self.machine.metadata.last_offset, bool(tx.records)), context)
        if changed:
            await self._wait_propagated(offset, request.timeout_ms)
        for r, item in zip(response.results, request.partitions, strict=True):
            if r.error_code == pb.NONE:
                log.info("reassignment of %s-%d: %s", r.topic, r.partition,
                         "cancelled" if item.cancel else f"to {list(item.replicas)}")
        return response

    async def ListPartitionReassignments(self, request: pb.ListPartitionReassignmentsRequest,
                                         context: Context,
                                         ) -> pb.ListPartitionReassignmentsResponse:
        return await self._run("ListPartitionReassignments", lambda tx, now: (
            self.machine.list_partition_reassignments(tx, now, request)), context)

    # ------------------------------------------------------------ users and ACLs
    # Answered once durable; brokers learn the change from the next UpdateMetadata (waited
    # for as CreateTopics does, so a client's next connection sees it).

    async def _security_change(self, rpc: str, command: Callable[[Tx, int, Any], T], request: Any,
                               context: Context) -> T:
        response, offset, changed = await self._run(rpc, lambda tx, now: (
            command(tx, now, request), self.machine.metadata.last_offset, bool(tx.records)),
            context)
        if changed:
            await self._wait_propagated(offset, self.propagation_wait_ms_max)
        return response

    async def AlterUserScramCredentials(self, request: pb.AlterUserScramCredentialsRequest,
                                        context: Context) -> pb.AlterUserScramCredentialsResponse:
        response = await self._security_change(
            "AlterUserScramCredentials", self.machine.alter_user_scram_credentials, request,
            context)
        for r in response.results:
            if r.error_code == pb.NONE:
                log.info("SCRAM credentials of user %r changed", r.user)
        return response

    async def DescribeUserScramCredentials(self, request: pb.DescribeUserScramCredentialsRequest,
                                           context: Context,
                                           ) -> pb.DescribeUserScramCredentialsResponse:
        return await self._run("DescribeUserScramCredentials", lambda tx, now: (
            self.machine.describe_user_scram_credentials(tx, now, request)), context)

    async def CreateAcls(self, request: pb.CreateAclsRequest,
                         context: Context) -> pb.CreateAclsResponse:
        return await self._security_change("CreateAcls", self.machine.create_acls, request,
                                           context)

    async def DescribeAcls(self, request: pb.DescribeAclsRequest,
                           context: Context) -> pb.DescribeAclsResponse:
        return await self._run("DescribeAcls", lambda tx, now: (
            self.machine.describe_acls(tx, now, request)), context)

    async def DeleteAcls(self, request: pb.DeleteAclsRequest,
                         context: Context) -> pb.DeleteAclsResponse:
        return await self._security_change("DeleteAcls", self.machine.delete_acls, request,
                                           context)

    async def AlterClientQuotas(self, request: pb.AlterClientQuotasRequest,
                                context: Context) -> pb.AlterClientQuotasResponse:
        # Answered once the brokers have the new quotas (as a user or ACL change), so
        # a client altering its quota then producing is held to it.
        response = await self._security_change(
            "AlterClientQuotas", self.machine.alter_client_quotas, request, context)
        for a, r in zip(request.alterations, response.results, strict=True):
            if r.error_code == pb.NONE and not request.validate_only:
                log.info("client quotas of %s altered: %s", a.entity,
                         {op.key: None if op.remove else op.value for op in a.ops})
        return response

    async def DescribeClientQuotas(self, request: pb.DescribeClientQuotasRequest,
                                   context: Context) -> pb.DescribeClientQuotasResponse:
        return await self._run("DescribeClientQuotas", lambda tx, now: (
            self.machine.describe_client_quotas(tx, now, request)), context)
