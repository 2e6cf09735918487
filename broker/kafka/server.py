"""The broker's Kafka listener: Kafka's binary protocol over TCP, on the broker's own loop.

One coroutine per connection reads frames in order. Each request is decoded
(``codec``) and handed to its API (``apis``), which does in-order work at once
(a produce's append) and returns an awaitable answer; answers are written in
request order by the connection's writer task, as Kafka's clients expect
(a long-polling fetch holds back the answers after it, as in Kafka). At most
``IN_FLIGHT_MAX`` requests wait per connection; then reading pauses.

Hostile input costs its own connection only, never data: a size prefix above
``socket.request.max.bytes`` (or negative) is refused before the body is read;
garbage, an unknown API key or a version we cannot decode closes the
connection with one log line. An ApiVersions of a version we do not know gets
a v0 answer with UNSUPPORTED_VERSION and our versions (KIP-511), so a newer
client can step down. A broken invariant stops the broker (``supervisor``),
as on the gRPC paths. A connection's tasks are not background tasks: what
kills one ends that connection only, but is logged (``_connection_done``),
never lost.

With ``ssl_context`` (the broker's ``--tls-*`` files) the listener speaks TLS
only (Kafka's ``security.protocol=SSL`` with ``ssl.client.auth=none``): a
plaintext client fails the handshake, which times out after
``TLS_HANDSHAKE_TIMEOUT_S``, and never reaches the protocol. A client
certificate is asked for but not required (``ssl.client.auth=requested``): a
verified one names the connection's principal (``User:<CN>``).

Connections are limited and expire (``connection_quotas``, Kafka's names):
``max.connections``, ``max.connections.per.ip`` (and its overrides) and
``max.connection.creation.rate`` refuse a new connection by closing it at once
(counted by ``on_refused``); a connection that completes no request and is sent
no answer for ``connections.max.idle.ms`` (one with a request in flight is not
idle) is closed by the listener's expiry task, so a client that sends nothing,
or a frame a byte a second, does not hold a connection for ever.

With ``security`` (``broker.security``), each connection gets its own
``sasl.ConnectionSecurity`` (in its own copy of ``Services``): with SASL
mechanisms configured, nothing but ApiVersions, SaslHandshake and
SaslAuthenticate is served before authentication (anything else closes the
connection); a refused exchange is answered, then closed; after a
SaslHandshake v0 the next frame is a raw SASL token, answered raw.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

from tidewater.broker.clock import mono_ms
from tidewater.broker.kafka import (
    apis,
    config_apis,
    quorum_apis,
    quota_apis,
    reassign_apis,
    topic_apis,
)
from tidewater.broker.kafka.client_quotas import (
    CONSUMER_BYTE_RATE,
    PERCENT_PER_NS,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    quota_user,
)
from tidewater.broker.kafka.codec import (
    RequestHead,
    UnknownApiKeyError,
    build,
    decode_request,
    encode_response_parts,
    peek_head,
    response_type,
)
from tidewater.broker.kafka.connection_quotas import ConnectionLimits, ConnectionQuotas
from tidewater.broker.kafka.coordinator_api_keys import GROUP_API_NAMES
from tidewater.broker.kafka.framing import FrameConnection, FrameSizeError
from tidewater.broker.kafka.sasl import ConnectionSecurity, tls_principal
from tidewater.broker.security.settings import BrokerSecurity
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ANONYMOUS
from tidewater.proto.errors import InvalidRequestError, InvariantViolation, UnsupportedVersionError
from tidewater.proto.forwarded_principal import FORWARDED
from tidewater.proto.scram import SaslAuthenticationError
from tidewater.proto.supervisor import TaskSupervisor

log = logging.getLogger("tidewater.broker.kafka")

IN_FLIGHT_MAX = 64
TLS_HANDSHAKE_TIMEOUT_S = 10.0
_SIZE_BYTES = 4
_RAW_HEAD = RequestHead(-1, 0, 0, None)  # a raw SASL token (after SaslHandshake v0)


@dataclasses.dataclass(frozen=True, slots=True)
class RawToken:
    """An answer written as a bare size-prefixed SASL token, no Kafka header."""

    data: bytes


# What a connection's writer task takes, in request order: the request's head, its answer
# (values to encode, a raw SASL token, or None for no answer), when it was read and the
# throttle time its reading decided (a produce's, by its size; else 0).
_Answer: TypeAlias = asyncio.Future[apis.Response | RawToken]
_Answers: TypeAlias = asyncio.Queue[tuple[RequestHead, _Answer, float, int] | None]


@dataclasses.dataclass
class _Mute:
    """A throttled connection's mute (KIP-219): after an answer carrying a throttle
    time is sent, the next request is not taken until the time has passed, as Kafka
    stops reading the channel. The client is told the time and backs off itself too."""

    until_ms: int = 0

    async def wait(self) -> None:
        delay_ms = self.until_ms - mono_ms()
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
# A socket's peername: (host, port) or, IPv6, (host, port, flowinfo, scope_id).
_Peer: TypeAlias = tuple[object, ...] | None


class KafkaListener:
    def __init__(self, services: apis.Services, *, host: str, port: int, max_request_bytes: int,
                 supervisor: TaskSupervisor, unauthenticated_request_bytes_max: int = 524_288,
                 observe: Callable[[str, float, list[int]], None] | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 security: BrokerSecurity | None = None,
                 quotas: ConnectionQuotas | None = None,
                 on_refused: Callable[[str], None] | None = None,
                 on_idle_closed: Callable[[], None] | None = None,
                 on_failed_authentication: Callable[[], None] | None = None) -> None:
        self.services = services
        # Shared by a broker's Kafka listeners (max.connections counts them all); None:
        # Kafka's defaults, for this listener alone.
        self.quotas = quotas or ConnectionQuotas(ConnectionLimits(), mono_ms())
        self._on_refused = on_refused or (lambda reason: None)  # metrics: refused, by limit
        self._on_idle_closed = on_idle_closed or _nothing  # metrics: closed idle
        self._on_failed_authentication = on_failed_authentication or _nothing  # metrics
        self.security = security  # broker.security.BrokerSecurity; None: no checks at all
        self.ssl_context = ssl_context
        self.host, self.port = host, port
        self.max_request_bytes = max_request_bytes
        # sasl.server.max.receive.size: before a SASL client authenticates, its frames are
        # held to this (Kafka's 512 KiB), so nobody unauthenticated makes the broker read,
        # buffer or decode a large request.
        self.unauthenticated_request_bytes_max = min(unauthenticated_request_bytes_max,
                                                     max_request_bytes)
        self.supervisor = supervisor
        # (api name, seconds, error codes answered) -> None: the broker's metrics.
        self._observe = observe or (lambda name, seconds, errors: None)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        # Each open connection's transport and the address its quota is counted under.
        self._open_connections: dict[FrameConnection, str] = {}
        self._expiry: asyncio.Task[None] | None = None
        self.bound_port = 0

    async def start(self) -> int:
        tls = self.ssl_context is not None
        loop = asyncio.get_running_loop()
        # A SASL listener's connections start at the pre-authentication limit: bytes can
        # arrive and be parsed before the connection's task first runs.
        sasl = self.security is not None and self.security.sasl_enabled
        first_frame_bytes_max = (self.unauthenticated_request_bytes_max if sasl
                                 else self.max_request_bytes)
        self._server = await loop.create_server(
            lambda: FrameConnection(self._open, frame_bytes_max=first_frame_bytes_max),
            self.host, self.port, reuse_address=True, ssl=self.ssl_context,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if tls else None)
        self.bound_port = self._server.sockets[0].getsockname()[1]
        self._expiry = self.supervisor.spawn(self._expire_idle(), "kafka-idle-expiry")
        return self.bound_port

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _open(self, connection: FrameConnection) -> None:
        peer = connection.get_extra_info("peername")
        host = str(peer[0]) if peer else ""
        refused = self.quotas.admit(host, mono_ms())
        if refused is not None:
            # Closed before anything is read: a refused client costs one accept.
            log.debug("kafka: refusing a connection from %s: %s", host, refused)
            self._on_refused(refused)
            connection.close()
            return
        self._open_connections[connection] = host
        # Not supervised: a connection's failure is its own (stop() cancels them all).
        task = asyncio.get_running_loop().create_task(self._serve(connection),
                                                      name="kafka-connection")
        self._connections.add(task)
        task.add_done_callback(functools.partial(self._connection_done, connection, host))

    async def _expire_idle(self) -> None:
        """Close connections idle for ``connections.max.idle.ms`` (see the module's
        docstring), checked a tenth of that apart (at most once a second): a connection
        is closed between 1 and 1.1 times the limit after its last activity."""
        idle_ms = self.quotas.limits.idle_ms
        interval_s = min(max(idle_ms / 10, 10), 1000) / 1000
        while True:
            await asyncio.sleep(interval_s)
            now = mono_ms()
            closed = 0
            for connection in list(self._open_connections):
                if connection.requests_in_flight == 0 \
                        and now - connection.last_active_ms > idle_ms:
                    log.debug("kafka: closing %s: idle for %d ms",
                              self._open_connections[connection],
                              now - connection.last_active_ms)
                    del self._open_connections[connection]
                    self._on_idle_closed()
                    connection.close()
                    closed += 1
            if closed:  # one line a sweep, however many (a flood must not flood the log)
                log.info("kafka: closed %d connection(s) idle for over %d ms "
                         "(connections.max.idle.ms)", closed, idle_ms)

    def _connection_done(self, connection: FrameConnection, host: str,
                         task: asyncio.Task[None]) -> None:
        """A connection's exception is not lost: an InvariantViolation stops the broker,
        anything else unexpected is logged with its traceback (the connection is closed).
        Its quota is released, whoever closed it."""
        self._connections.discard(task)
        self._open_connections.pop(connection, None)
        self.quotas.release(host)
        if task.cancelled() or (error := task.exception()) is None:
            return
        if isinstance(error, InvariantViolation):
            self.supervisor.fail(error)
        else:
            log.error("kafka: a connection's task failed", exc_info=error)

    async def _serve(self, connection: FrameConnection) -> None:
        peer: _Peer = connection.get_extra_info("peername")
        answers: _Answers = asyncio.Queue(maxsize=IN_FLIGHT_MAX)
        # The connection's writer, a child of this coroutine awaited in the finally below
        # (its exception is raised there). One that fails while requests are still read
        # ends the reading: a full queue would otherwise block the reader for ever.
        serving = asyncio.current_task()
        reading = True

        def sender_done(task: asyncio.Future[None]) -> None:
            error = None if task.cancelled() else task.exception()
            # A lost client (ConnectionError) ends the reader by itself.
            if reading and serving is not None and error is not None \
                    and not isinstance(error, ConnectionError):
                serving.cancel()
        security = None
        if self.security is not None and self.security.secured:  # else: no per-request checks
            security = ConnectionSecurity(
                self.security, host=str(peer[0]) if peer else "",
                tls_principal=tls_principal(connection.get_extra_info("peercert")),
                on_failure=self._on_failed_authentication)
        mute = _Mute()
        sender = asyncio.ensure_future(self._send_answers(answers, connection, peer, security,
                                                          mute))
        sender.add_done_callback(sender_done)
        try:
            await self._read_requests(connection, answers, peer, security, mute)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away; its unanswered requests go with it
        except asyncio.CancelledError:
            sender.cancel()  # stop(): end quietly, answering nothing more
        except InvariantViolation as e:
            self.supervisor.fail(e)
            raise
        finally:
            reading = False
            if not sender.done():
                try:
                    answers.put_nowait(None)  # answer what was read, then close
                except asyncio.QueueFull:
                    sender.cancel()
            try:
                await sender
            except (asyncio.CancelledError, ConnectionError):
                pass
            finally:
                connection.close()

    async def _read_requests(self, reader: FrameConnection, answers: _Answers, peer: _Peer,
                             connection: ConnectionSecurity | None, mute: _Mute) -> None:
        services = dataclasses.replace(self.services, connection=connection,
                                       client_host=f"/{peer[0]}" if peer else "")
        while True:
            authenticated = connection is None or connection.authenticated
            reader.frame_bytes_max = (self.max_request_bytes if authenticated
                                      else self.unauthenticated_request_bytes_max)
            try:
                frame = await reader.read_frame()
            except FrameSizeError as e:
                log.warning("kafka: closing %s: request size %d outside 1..%d (%s)", peer,
                            e.size, e.frame_bytes_max,
                            "socket.request.max.bytes" if authenticated
                            else "sasl.server.max.receive.size, before authentication")
                return
            # A throttled connection's next request waits out the throttle (held here, as
            # unread: Kafka mutes the channel), so a client ignoring throttle_time_ms is
            # held to its quota all the same.
            await mute.wait()
            started = time.perf_counter()
            if connection is not None and connection.raw_tokens:
                try:
                    token = await connection.authenticate(bytes(frame), mono_ms())
                except SaslAuthenticationError as e:
                    log.warning("kafka: closing %s: %s", peer, e)
                    await connection.failure_delay()  # KIP-306, then closed
                    return
                reader.requests_in_flight += 1
                await answers.put((_RAW_HEAD, _resolved(RawToken(token)), started, 0))
                continue
            try:
                head, body = decode_request(frame, apis.SUPPORTED)
            except UnsupportedVersionError as e:
                api_key, api_version, correlation_id = peek_head(frame)
                if api_key != apis.API_VERSIONS:
                    log.warning("kafka: closing %s: %s", peer, e)
                    return
                # KIP-511: a v0 answer any client can read, listing what we serve.
                head = RequestHead(api_key, 0, correlation_id, None)
                reader.requests_in_flight += 1
                await answers.put((head, _resolved(apis.api_versions_values(
                    pb.UNSUPPORTED_VERSION)), started, 0))
                continue
            except (UnknownApiKeyError, InvalidRequestError) as e:
                log.warning("kafka: closing %s: %s (frame starts %s)", peer, e, frame[:64].hex())
                return
            if connection is not None and (
                    refused := connection.refusal(head.api_key, mono_ms())) is not None:
                log.warning("kafka: closing %s: API key %d %s", peer, head.api_key, refused)
                return
            if head.api_version < apis.DECODED_FROM.get(head.api_key, 0):
                log.warning("kafka: closing %s: API key %d v%d (message format v0/v1) is not "
                            "served; RecordBatch v2 needs v%d+", peer, head.api_key,
                            head.api_version, apis.DECODED_FROM[head.api_key])
                return
            # Whom an admin call forwarded to the controller is made for (its child
            # tasks copy this context): the controller authorizes that principal too.
            FORWARDED.set((connection.session.principal, connection.session.host)
                          if connection is not None else None)
            handling_started = time.perf_counter()
            try:
                pending = await apis.HANDLERS[head.api_key](services, head, body)
            except InvariantViolation:
                raise
            except Exception:
                # No general way to answer every API with an error: close, as Kafka does
                # for a request it cannot handle; nothing was changed for it.
                log.exception("kafka: closing %s: API key %d v%d failed", peer, head.api_key,
                              head.api_version)
                return
            # A per-request child: awaited in order by the writer (``_send_answers``), which
            # handles what it raises; cancelled with the connection.
            answer: _Answer = asyncio.ensure_future(pending)
            reader.requests_in_flight += 1
            # A produce is charged as it is read, and the connection muted at once: Kafka
            # reads one request at a time per connection, so a producer pipelining many
            # requests must not get them all read before its first throttled answer.
            throttle_ms = self._charge_quota(head, connection, len(frame), 0)
            # request_percentage (KIP-124) is charged the time the handler took before
            # it handed back its answer: the in-order work done at once, as Kafka charges
            # its request thread's time, not a long poll's or a forward's wait.
            if head.api_key not in _REQUEST_QUOTA_EXEMPT:
                throttle_ms = max(throttle_ms, self._charge_request_time(
                    head, connection, time.perf_counter() - handling_started))
            if throttle_ms:
                mute.until_ms = max(mute.until_ms, mono_ms() + throttle_ms)
            await answers.put((head, answer, started, throttle_ms))
            if connection is not None and connection.close_after_answer:
                return  # a refused SASL exchange: answered, then closed

    async def _send_answers(self, answers: _Answers, writer: FrameConnection,
                            peer: _Peer, connection: ConnectionSecurity | None,
                            mute: _Mute) -> None:
        # A fetch's throttle mutes after its answer is sent (KIP-219), as Kafka's does.
        try:
            while (item := await answers.get()) is not None:
                head, pending, started, throttle_ms = item
                try:
                    values = await pending
                except InvariantViolation as e:
                    self.supervisor.fail(e)
                    raise
                except Exception:
                    # No general way to answer every API with an error: close, as Kafka
                    # does for a request it cannot handle; the client retries elsewhere.
                    log.exception("kafka: closing %s: API key %d v%d failed", peer,
                                  head.api_key, head.api_version)
                    writer.close()
                    return
                if isinstance(values, RawToken):
                    writer.write(len(values.data).to_bytes(_SIZE_BYTES, "big") + values.data)
                    await writer.drain()
                elif values is not None:
                    body = build(response_type(head.api_key, head.api_version), values)
                    parts = encode_response_parts(head, body)
                    if head.api_key == apis.FETCH:
                        # A fetch is charged its answer's size, known only now.
                        throttle_ms, values = self._throttled_fetch(
                            head, connection, values, sum(len(p) for p in parts),
                            throttle_ms)
                    if throttle_ms and "throttle_time" in values:
                        # throttle_time_ms is a fixed-size int32: the size charged holds.
                        values["throttle_time"] = throttle_ms
                        body = build(response_type(head.api_key, head.api_version), values)
                        parts = encode_response_parts(head, body)
                    await writer.write_parts(parts)
                    if throttle_ms and head.api_key == apis.FETCH:
                        mute.until_ms = max(mute.until_ms, mono_ms() + throttle_ms)
                writer.requests_in_flight -= 1  # answered: the idle clock runs again
                self._observe(_API_NAMES.get(head.api_key, str(head.api_key)),
                              time.perf_counter() - started, list(error_codes(values)))
        finally:
            while not answers.empty():
                item = answers.get_nowait()
                if item is not None:
                    item[1].cancel()


    def _throttled_fetch(self, head: RequestHead, connection: ConnectionSecurity | None,
                         values: dict[str, Any], answer_bytes: int, throttle_ms: int
                         ) -> tuple[int, dict[str, Any]]:
        """A fetch's answer charged to its byte-rate quota: (throttle time, the values to
        answer). Throttled, as Kafka (KIP-219), it is answered with no partitions and
        its bytes are not charged: the client fetches the same records again after the
        throttle time. Unless the bucket was full before: an answer larger than the
        bucket would be refused however long its client waited, so it is served."""
        quotas = self.services.metadata_cache.client_quotas
        decision = quotas.record(CONSUMER_BYTE_RATE, _quota_user(connection),
                                 head.client_id or "", answer_bytes, mono_ms())
        throttle_ms = max(throttle_ms, decision.throttle_time_ms)
        if not throttle_ms or decision.from_full_bucket or not values.get("responses"):
            return throttle_ms, values
        if decision.sensor is not None:
            quotas.unrecord(CONSUMER_BYTE_RATE, decision.sensor, answer_bytes, mono_ms())
        # The session (if any) keeps its id: a client's incremental session goes on, a
        # new full-fetch session is dropped by the client (Kafka answers the throttled
        # full fetch with no session), and the broker evicts it from its cache.
        return throttle_ms, apis.throttled_fetch_values(values)

    def _charge_quota(self, head: RequestHead, connection: ConnectionSecurity | None,
                      request_bytes: int, response_bytes: int) -> int:
        """Charge a Produce (its request's size) or a Fetch (its answer's size) to the
        client's byte-rate quota (``client_quotas``); the throttle time to answer."""
        if head.api_key == apis.PRODUCE:
            key, charged_bytes = PRODUCER_BYTE_RATE, request_bytes
        elif head.api_key == apis.FETCH:
            key, charged_bytes = CONSUMER_BYTE_RATE, response_bytes
        else:
            return 0
        decision = self.services.metadata_cache.client_quotas.record(
            key, _quota_user(connection), head.client_id or "", charged_bytes, mono_ms())
        return decision.throttle_time_ms

    def _charge_request_time(self, head: RequestHead, connection: ConnectionSecurity | None,
                             handling_s: float) -> int:
        decision = self.services.metadata_cache.client_quotas.record(
            REQUEST_PERCENTAGE, _quota_user(connection), head.client_id or "",
            handling_s * 1e9 * PERCENT_PER_NS, mono_ms())
        return decision.throttle_time_ms


# Not charged to request_percentage, as in Kafka: what a client needs to learn what it
# may send and to log in (a throttled login could never clear its own throttle).
_REQUEST_QUOTA_EXEMPT = frozenset({apis.API_VERSIONS, 17, 36})  # SaslHandshake, -Authenticate


def _quota_user(connection: ConnectionSecurity | None) -> str:
    """Kafka's quota user: the principal's name ("alice" of "User:alice")."""
    return quota_user(connection.session.principal if connection is not None else ANONYMOUS)


def error_codes(values: object) -> Iterator[int]:
    """Every non-zero ``error_code`` in a response's values, top level and nested."""
    if isinstance(values, dict):
        for key, value in values.items():
            if key == "error_code":
                if value:
                    yield int(value)
            elif isinstance(value, (dict, list)):
                yield from error_codes(value)
    elif isinstance(values, list):
        for item in values:
            yield from error_codes(item)


def _nothing() -> None:
    pass


def _resolved(value: apis.Response | RawToken) -> _Answer:
    future: _Answer = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


_API_NAMES = {apis.PRODUCE: "Produce", apis.FETCH: "Fetch", apis.LIST_OFFSETS: "ListOffsets",
              apis.METADATA: "Metadata", apis.OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpoch",
              apis.API_VERSIONS: "ApiVersions", apis.CREATE_TOPICS: "CreateTopics",
              apis.DELETE_TOPICS: "DeleteTopics", apis.DESCRIBE_CONFIGS: "DescribeConfigs",
              apis.DESCRIBE_CLUSTER: "DescribeCluster", apis.CREATE_PARTITIONS: "CreatePartitions",
              17: "SaslHandshake", 36: "SaslAuthenticate", 29: "DescribeAcls",
              30: "CreateAcls", 31: "DeleteAcls", 50: "DescribeUserScramCredentials",
              51: "AlterUserScramCredentials", -1: "SaslToken", 22: "InitProducerId",
              21: "DeleteRecords", 35: "DescribeLogDirs", 27: "WriteTxnMarkers",
              **GROUP_API_NAMES, **config_apis.API_NAMES, **topic_apis.API_NAMES,
              **quota_apis.API_NAMES, **reassign_apis.API_NAMES,
              **quorum_apis.API_NAMES}
