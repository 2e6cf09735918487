"""Raft messages between controller processes: outbound queues per peer, inbound checks.

Outbound: one bounded queue and one supervised sender task per configured peer.
Raft tolerates loss (every request is resent on a timer), so a full queue drops
its oldest message and a failed call drops its batch: a peer that is down never
makes the node wait, and memory stays bounded. Channels reconnect with a short
backoff (gRPC's default grows to two minutes: a restarted peer would go
unheard for that long).

Inbound (``check_batch``): the sender must be a configured voter or observer
other than us (CLUSTER_AUTHORIZATION_FAILED), connect from the host configured
for it when that is an IP address (CLUSTER_AUTHORIZATION_FAILED), address us
(INVALID_REQUEST), send at most ``BATCH_MESSAGES_MAX`` messages of at most
``codec.ENCODED_BYTES_MAX`` bytes (MESSAGE_TOO_LARGE), each a well-formed
message (INVALID_REQUEST) whose ``source`` is the sender and whose
``destination`` is us (INVALID_REQUEST: a forged or misrouted message). What
these checks alone cannot stop is a process that lies about its id from the
right host: that is what mTLS is for.

mTLS (the controller started with ``--tls-*``): the Raft port speaks TLS only and
requires a client certificate signed by the cluster's CA, and senders present the
controller's own certificate. ``check_controller_principal`` then admits to the
Raft RPCs (RaftMessages: votes, fetches of the metadata log, BeginQuorumEpoch;
QuorumRead; QuorumPropose) only a certificate of role ``controller``
(``OU=controller``, ``tools/certs.py``); a broker's or a client's certificate is
refused with CLUSTER_AUTHORIZATION_FAILED. A per-node certificate named
``controller-<id>`` is bound to that id: it may send only as node ``<id>``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging

import grpc

from tidewater.controller.quorum import codec
from tidewater.controller.quorum.config import Endpoint
from tidewater.controller.raft import Message
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import (
    ClusterAuthorizationFailedError,
    InvalidRequestError,
    MessageTooLargeError,
)
from tidewater.proto.supervisor import TaskSupervisor
from tidewater.proto.tls import ROLE_CONTROLLER, Principal, TlsMaterial, channel_credentials

log = logging.getLogger("tidewater.controller.quorum")

BATCH_MESSAGES_MAX = 256
# The whole RaftMessages request (the server's receive limit). A sender's batch holds at
# most BATCH_BYTES_MAX of messages (one message is at most codec.ENCODED_BYTES_MAX, 8 MiB),
# leaving room for the protobuf framing.
REQUEST_BYTES_MAX = 16 * 1024 * 1024
BATCH_BYTES_MAX = REQUEST_BYTES_MAX - 64 * 1024
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_send_message_length", REQUEST_BYTES_MAX),
]


def peer_host(peer: str) -> str | None:
    """The address in grpc's ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    scheme, _, rest = peer.partition(":")
    if scheme == "ipv4":
        return rest.rpartition(":")[0]
    if scheme == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None


CONTROLLER_NAME_PREFIX = "controller-"


def check_controller_principal(principal: Principal | None, *, source_id: int | None = None,
                               what: str = "Raft messages") -> None:
    """Raise CLUSTER_AUTHORIZATION_FAILED unless ``principal`` is a controller's certificate
    (and, when it names a node as ``controller-<id>`` and ``source_id`` is given, that node)."""
    if principal is None:
        raise ClusterAuthorizationFailedError(f"{what} need a controller's client certificate")
    if principal.role != ROLE_CONTROLLER:
        raise ClusterAuthorizationFailedError(
            f"{what} are taken only from controllers; {principal.name!r} is a "
            f"{principal.role or 'role-less'} certificate")
    if source_id is not None and principal.name.startswith(CONTROLLER_NAME_PREFIX):
        digits = principal.name[len(CONTROLLER_NAME_PREFIX):]
        if digits.isdigit() and int(digits) != source_id:
            raise ClusterAuthorizationFailedError(
                f"the certificate of {principal.name} sent {what} as node {source_id}")


def check_batch(batch: pb.RaftMessageBatch, *, local_id: int, peers: dict[int, Endpoint],
                peer: str) -> list[Message]:
    """The messages of an inbound batch, or the typed error it is refused with."""
    endpoint = peers.get(batch.source_id)
    if endpoint is None:
        raise ClusterAuthorizationFailedError(
            f"node {batch.source_id} is not a configured voter or observer of node {local_id}")
    try:
        expected_host = ipaddress.ip_address(endpoint.host)
    except ValueError:
        expected_host = None  # a host name: nothing cheap to compare with
    if expected_host is not None:
        host = peer_host(peer)
        try:
            actual = ipaddress.ip_address(host) if host is not None else None
        except ValueError:
            actual = None
        if actual != expected_host:
            raise ClusterAuthorizationFailedError(
                f"node {batch.source_id} is configured at {endpoint.host}, the request came "
                f"from {peer}")
    if batch.destination_id != local_id:
        raise InvalidRequestError(f"a batch for node {batch.destination_id} reached node "
                                  f"{local_id}")
    if len(batch.messages) > BATCH_MESSAGES_MAX:
        raise MessageTooLargeError(f"{len(batch.messages)} messages in one batch, over "
                                   f"{BATCH_MESSAGES_MAX}")
    messages = []
    for data in batch.messages:
        if len(data) > codec.ENCODED_BYTES_MAX:
            raise MessageTooLargeError(f"a message of {len(data)} bytes, over "
                                       f"{codec.ENCODED_BYTES_MAX}")
        message = codec.decode(data)
        if message.source.id != batch.source_id or message.destination != local_id:
            raise InvalidRequestError(
                f"a {type(message).__name__} from {message.source} to {message.destination} "
                f"in a batch from node {batch.source_id} to node {local_id}")
        messages.append(message)
    return messages


class PeerSender:
    """Delivers Raft messages to one peer, in order, dropping what it cannot deliver."""

    def __init__(self, local_id: int, peer_id: int, endpoint: Endpoint, *, queue_max: int,
                 batch_max: int, request_timeout_ms: int, tls: TlsMaterial | None = None):
        self.local_id = local_id
        self.peer_id = peer_id
        self.endpoint = endpoint
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=queue_max)
        self._batch_max = min(batch_max, BATCH_MESSAGES_MAX)
        self._timeout_s = request_timeout_ms / 1000
        self._channel = (
            grpc.aio.insecure_channel(str(endpoint), options=CHANNEL_OPTIONS) if tls is None
            else grpc.aio.secure_channel(str(endpoint), channel_credentials(tls),
                                         options=CHANNEL_OPTIONS))
        self._stub = pb_grpc.ControllerQuorumStub(self._channel)
        self.dropped = 0
        self._last_error: str | None = None

    def send(self, message: Message) -> None:
        if self._queue.full():
            self._queue.get_nowait()  # the oldest: Raft resends what still matters
            self.dropped += 1
        self._queue.put_nowait(codec.encode(message))

    async def run(self) -> None:
        carried: bytes | None = None  # taken from the queue, too large for the last batch
        while True:
            batch = [carried if carried is not None else await self._queue.get()]
            carried = None
            size = len(batch[0])
            while len(batch) < self._batch_max and not self._queue.empty():
                message = self._queue.get_nowait()
                if size + len(message) > BATCH_BYTES_MAX:
                    carried = message  # first in the next batch: a batch stays under the limit
                    break
                batch.append(message)
                size += len(message)
            request = pb.RaftMessageBatch(source_id=self.local_id, destination_id=self.peer_id,
                                          messages=batch)
            try:
                ack = await self._stub.RaftMessages(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as e:
                self.dropped += len(batch)
                self._note(f"{e.code().name}: {e.details()}")
                continue
            if ack.error_code != pb.NONE:
                self.dropped += len(batch)
                self._note(f"{pb.ErrorCode.Name(ack.error_code)}: {ack.error_message}")
            else:
                self._last_error = None

    def _note(self, error: str) -> None:
        # Once per change: a peer that is down for minutes is one line, not thousands.
        if error != self._last_error:
            log.info("node %d -> node %d at %s: %s", self.local_id, self.peer_id, self.endpoint,
                     error)
            self._last_error = error

    async def close(self) -> None:
        await self._channel.close(grace=None)


class Transport:
    def __init__(self, local_id: int, peers: dict[int, Endpoint], supervisor: TaskSupervisor, *,
                 queue_max: int, batch_max: int, request_timeout_ms: int,
                 tls: TlsMaterial | None = None):
        self.local_id = local_id
        self.senders = {
            peer_id: PeerSender(local_id, peer_id, endpoint, queue_max=queue_max,
                                batch_max=batch_max, request_timeout_ms=request_timeout_ms,
                                tls=tls)
            for peer_id, endpoint in peers.items()}
        for sender in self.senders.values():
            supervisor.spawn(sender.run(), name=f"raft-sender-{sender.peer_id}")
        self.unroutable = 0
        self._unroutable_logged: set[int] = set()

    def send(self, message: Message) -> None:
        sender = self.senders.get(message.destination)
        if sender is None:
            # A voter the log names but this node's configuration does not.
            self.unroutable += 1
            if message.destination not in self._unroutable_logged:  # once per node, not per tick
                self._unroutable_logged.add(message.destination)
                log.warning("no address for node %d (not in --voters/--observers): Raft "
                            "messages to it are dropped", message.destination)
            return
        sender.send(message)

    async def close(self) -> None:
        for sender in self.senders.values():
            await sender.close()
