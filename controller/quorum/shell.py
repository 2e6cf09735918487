"""The quorum shell: one controller's RaftNode driven by asyncio, its files and its peers.

One owner: every call into the node (``step``, ``tick``, ``propose``,
``change_voters``, ``compact``) happens on the event loop and is followed, with
no ``await`` in between, by ``_drain``, which carries out each ``Ready`` in the
order the core's package docstring sets:

1. durable: ``RaftStorage.carry_out`` (snapshot, truncate, append, quorum state,
   each fsynced). A failure raises ``KafkaStorageError``: nothing of that Ready
   is sent or applied, ``advance`` is never called, the storage refuses every
   later write and the process stops (``on_fatal``; exit code 3). Restarting
   recovers from the disk (the torn tail is cut).
2. send: the messages go to the peers' queues (``transport``).
3. apply: a ``snapshot_install`` replaces the application's image first, then
   each committed entry is applied in order; proposals waiting on those offsets
   are answered.
4. ``advance``.

The files are written from the event loop (blocking fsyncs): simple, and right
for the order above; moving them to a thread is an optimisation for later.

After applying, a node that applied ``snapshot_interval_entries`` since its last
snapshot compacts (``RaftNode.compact`` with the application's image).

Background tasks (the tick loop, one sender per peer) run under a
``TaskSupervisor``: one that dies stops the process.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from tidewater.broker.servicers.grpc_limits import GrpcLimits
from tidewater.controller.quorum.commit_waiters import CommitWaiters
from tidewater.controller.quorum.config import QuorumConfig
from tidewater.controller.quorum.errors import QuorumNotCaughtUpError, QuorumStoppedError
from tidewater.controller.quorum.metrics import RaftMetrics
from tidewater.controller.quorum.record_log import CommittedRecords
from tidewater.controller.quorum.transport import REQUEST_BYTES_MAX, Transport
from tidewater.controller.raft import (
    Entry,
    Message,
    NotLeaderError,
    ProposalRejectedError,
    QuorumDescription,
    RaftNode,
    VoterKey,
)
from tidewater.controller.raft.storage import RaftStorage
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import (
    KafkaStorageError,
    MessageTooLargeError,
    NotControllerError,
)
from tidewater.proto.supervisor import TaskSupervisor
from tidewater.proto.tls import server_credentials

log = logging.getLogger("tidewater.controller.quorum")


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class Application(Protocol):
    """What the shell replicates: ``CommittedRecords`` (the quorum module's own test
    application) or the controller's metadata (``metadata_app.MetadataApplication``).
    ``apply`` sees every committed entry in offset order (LEADER_CHANGE and VOTERS too);
    ``restore`` replaces everything with a snapshot's image."""

    applied_offset: int

    def apply(self, entry: Entry) -> None: ...

    def image(self) -> bytes: ...

    def restore(self, image: bytes, end_offset: int) -> None: ...


class QuorumShell:
    def __init__(self, config: QuorumConfig, *, on_fatal: Callable[[BaseException], None],
                 clock_ms: Callable[[], int] = monotonic_ms,
                 application: Application | None = None,
                 on_leadership: Callable[[bool, int], None] | None = None,
                 metrics: RaftMetrics | None = None):
        self.config = config
        self.metrics = metrics  # Kafka's raft-metrics (``metrics``), fed after each drain
        self._on_fatal_outer = on_fatal
        self._clock_ms = clock_ms
        self.supervisor = TaskSupervisor(self._on_fatal, process="controller")
        self.records: Application = application or CommittedRecords()
        # Called after each drain whose Readies moved this node into or out of leadership
        # (is_leader, epoch): the metadata owner starts or stops deciding there.
        self._on_leadership = on_leadership
        self._was_leader = False
        self._leader_epoch = 0
        self.failure: BaseException | None = None
        self.stopped = asyncio.Event()
        self.port = 0
        self._waiters = CommitWaiters(config.proposals_in_flight_max)
        # One timer, at the earliest waiter's deadline (``_arm_expiry``).
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_ms = 0
        self._storage: RaftStorage | None = None
        self._node: RaftNode | None = None
        self._transport: Transport | None = None
        self._server: grpc.aio.Server | None = None

    # ---- life cycle -----------------------------------------------------------------

    @property
    def node(self) -> RaftNode:
        if self._node is None:
            raise QuorumStoppedError("the quorum node is not running")
        return self._node

    @property
    def storage(self) -> RaftStorage:
        if self._storage is None:
            raise QuorumStoppedError("the quorum node is not running")
        return self._storage

    async def start(self) -> None:
        from tidewater.controller.quorum.service import QuorumService  # it imports this module
        from tidewater.controller.server import InvariantBoundary

        config = self.config
        storage = RaftStorage.open(config.data_dir)
        self._storage = storage
        local = VoterKey(config.node_id, storage.local_directory_id)
        if storage.snapshot is not None:
            self.records.restore(storage.snapshot.data, storage.snapshot.snapshot_id.offset)
        now_ms = self._clock_ms()
        self._node = RaftNode(config.raft, local, random.Random(), now_ms,
                              bootstrap_voters=storage.bootstrap_voters,
                              quorum_state=storage.quorum_state, snapshot=storage.snapshot,
                              entries=storage.entries,
                              bootstrap_servers=frozenset(config.voters))
        storage.entries = []  # the node keeps its own copy
        listen = config.listen_endpoint
        assert listen is not None  # QuorumConfig checks it
        # An InvariantViolation in a handler stops the node (INTERNAL to the caller), as in
        # the controller's own server.
        self._server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0),
                     ("grpc.max_receive_message_length", REQUEST_BYTES_MAX),
                     *GrpcLimits(max_connection_idle_ms=config.connections_max_idle_ms,
                                 max_connections=config.max_connections).options()],
            interceptors=[InvariantBoundary(self.supervisor)])
        pb_grpc.add_ControllerQuorumServicer_to_server(QuorumService(self), self._server)
        try:
            if config.tls is None:
                self.port = self._server.add_insecure_port(str(listen))
            else:
                # mTLS: only certificates of the cluster's CA get through the handshake;
                # which of them may send Raft messages is the service's check.
                self.port = self._server.add_secure_port(
                    str(listen), server_credentials(config.tls, require_client_auth=True))
        except RuntimeError as e:
            raise OSError(f"cannot listen on {listen}: {e}") from e
        if self.port == 0:
            raise OSError(f"cannot listen on {listen}")
        await self._server.start()
        self._transport = Transport(config.node_id, config.peers, self.supervisor,
                                    queue_max=config.peer_queue_messages_max,
                                    batch_max=config.peer_batch_messages_max,
                                    request_timeout_ms=config.raft.request_timeout_ms,
                                    tls=config.tls)
        self.supervisor.spawn(self._tick_loop(), name="raft-tick")
        self._drain()
        log.info("quorum node %s listening on %s (port %d), %s", local, listen, self.port,
                 "a voter" if self._node.is_voter else
                 "an observer (not in the voter set: it fetches, never votes)")

    async def stop(self) -> None:
        await self.supervisor.stop()
        if self._server is not None:
            await self._server.stop(grace=0.5)
        if self._transport is not None:
            await self._transport.close()
        self._waiters.fail_all(QuorumStoppedError("the quorum node stopped"))
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._storage is not None:
            try:
                self._storage.close()
            except OSError as e:
                # After a failed write the file's buffer may fail again as it is flushed on
                # close; the disk holds what recovery will see either way.
                if not self._storage.failed:
                    raise
                log.warning("closing the failed raft storage: %s", e)
        self._node = None
        self._storage = None
        self.stopped.set()

    def _on_fatal(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        self.stopped.set()
        self._on_fatal_outer(error)

    def _check_running(self) -> None:
        if self.failure is not None:
            raise QuorumStoppedError(f"the quorum node stopped after {self.failure!r}")

    async def _tick_loop(self) -> None:
        interval_s = self.config.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            if self.failure is not None:
                return
            self.node.tick(self._clock_ms())
            self._drain()

    # ---- carrying out Readies -------------------------------------------------------

    def _drain(self) -> None:
        """Carry out every Ready the node has, in the order the module docstring gives;
        then the metrics from the state that left."""
        self._drain_readies()
        if self.metrics is not None and self._node is not None:
            self.metrics.observe(self._node, set(self.config.peers), self._clock_ms())

    def _drain_readies(self) -> None:
        node, storage = self.node, self.storage
        transport = self._transport
        assert transport is not None
        while True:
            while node.has_ready():
                ready = node.ready()
                try:
                    storage.carry_out(ready)
                except KafkaStorageError as e:
                    # Never advance: the core must not act as if this had happened.
                    log.critical("raft storage write failed, stopping: %s", e)
                    self.supervisor.fail(e)
                    raise
                for message in ready.send:
                    transport.send(message)
                if ready.snapshot_install is not None:
                    snapshot = ready.snapshot_install
                    self.records.restore(snapshot.data, snapshot.snapshot_id.offset)
                    self._waiters.on_snapshot_installed(snapshot.snapshot_id.offset)
                for entry in ready.committed:
                    self.records.apply(entry)
                    self._waiters.on_committed(entry.offset, entry.epoch)
                node.advance(ready, self._clock_ms())
            self._maybe_leadership_changed(node)
            if (self.records.applied_offset - node.log_start_offset
                    < self.config.snapshot_interval_entries):
                return
            node.compact(self.records.image(), self._clock_ms())

    def _maybe_leadership_changed(self, node: RaftNode) -> None:
        leader = node.is_leader
        if leader == self._was_leader and (not leader or node.epoch == self._leader_epoch):
            return
        if self._was_leader:
            # Proposals of the lost epoch may still commit under the next leader, or be
            # truncated: either way this node can no longer answer for them.
            self._waiters.fail_all(NotControllerError(
                f"node {self.config.node_id} lost the leadership of epoch {self._leader_epoch}"))
        self._was_leader = leader
        self._leader_epoch = node.epoch if leader else 0
        if self._on_leadership is not None:
            self._on_leadership(leader, node.epoch)

    def _arm_expiry(self, deadline_ms: int | None) -> None:
        """Have ``_expire_waiters`` run at ``deadline_ms`` unless it runs before already."""
        if deadline_ms is None:
            return
        if self._expiry is not None:
            if self._expiry_ms <= deadline_ms:
                return
            self._expiry.cancel()
        delay_ms = max(deadline_ms - self._clock_ms(), 1)
        self._expiry = asyncio.get_running_loop().call_later(delay_ms / 1000,
                                                             self._expire_waiters)
        self._expiry_ms = deadline_ms

    def _expire_waiters(self) -> None:
        self._expiry = None
        self._arm_expiry(self._waiters.expire(self._clock_ms()))

    # ---- inputs ---------------------------------------------------------------------

    def step(self, messages: Sequence[Message]) -> None:
        self._check_running()
        node = self.node
        for message in messages:
            node.step(message, self._clock_ms())
        self._drain()

    def leader_hint(self) -> int:
        """The leader to retry on, -1 if unknown (or this node is not running)."""
        if self.failure is not None or self._node is None or self._node.leader_id is None:
            return -1
        return self._node.leader_id

    async def _wait_committed(self, offset: int, epoch: int, timeout_ms: int) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        now_ms = self._clock_ms()
        self._waiters.add(offset, epoch, future, now_ms=now_ms, timeout_ms=timeout_ms)
        if self.records.applied_offset > offset:
            # Committed in the drain right after the proposal (a one-voter quorum), with
            # no await since: the entry at ``offset`` is the one proposed in ``epoch``.
            self._waiters.on_committed(offset, epoch)
        if not future.done():
            self._arm_expiry(now_ms + timeout_ms)
        try:
            await future
        finally:
            self._waiters.discard(offset, future)  # a cancelled caller

    def _timeout_ms(self, requested_ms: int) -> int:
        if requested_ms <= 0:
            return self.config.propose_timeout_ms_default
        return min(requested_ms, self.config.propose_timeout_ms_max)

    async def propose(self, records: Sequence[bytes], timeout_ms: int = 0) -> tuple[int, int]:
        """Append ``records``; answer once they are committed and applied here.
        Returns (first offset, epoch)."""
        self._check_running()
        node = self.node
        limit = node.config.record_bytes_max
        if any(len(r) > limit for r in records):
            raise MessageTooLargeError(f"a record is larger than {limit} bytes")
        proposed_ms = self._clock_ms()
        try:
            first = node.propose(records, proposed_ms)
        except NotLeaderError as e:
            raise NotControllerError(str(e)) from e
        except ProposalRejectedError as e:
            raise QuorumNotCaughtUpError(str(e)) from e
        if self.metrics is not None:
            self.metrics.on_appended(len(records), proposed_ms)
        epoch = node.epoch
        self._drain()
        await self._wait_committed(first + len(records) - 1, epoch, self._timeout_ms(timeout_ms))
        if self.metrics is not None:
            now_ms = self._clock_ms()
            self.metrics.on_committed(now_ms - proposed_ms, now_ms)
        return first, epoch

    async def change_voters(self, *, add: VoterKey | None, remove: VoterKey | None,
                            timeout_ms: int = 0) -> None:
        self._check_running()
        node = self.node
        try:
            offset = node.change_voters(add=add, remove=remove, now_ms=self._clock_ms())
        except NotLeaderError as e:
            raise NotControllerError(str(e)) from e
        except ProposalRejectedError as e:
            raise QuorumNotCaughtUpError(str(e)) from e
        epoch = node.epoch
        self._drain()
        await self._wait_committed(offset, epoch, self._timeout_ms(timeout_ms))

    def describe(self) -> QuorumDescription:
        self._check_running()
        return self.node.describe(self._clock_ms())

    def now_ms(self) -> int:
        return self._clock_ms()
