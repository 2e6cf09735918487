"""Client ends of the ProduceStream and FetchStream RPCs: one long-lived stream per broker.

A message on an open gRPC stream costs about half the CPU of a unary call on
both sides (a ping-pong microbenchmark: unary 490-620 µs per round trip over
client and broker, a bidi stream 215-257 µs), which is most of a record's cost
at moderate rates with one record per request.

The sync gRPC API runs a stream with a request iterator, consumed by a gRPC
thread, and a response iterator, read here by one thread per stream. ``send``
queues a request with a callback; the reader calls it with the response
(matched by ``correlation_id`` for ProduceStream, in order for FetchStream) or,
once the stream breaks, every pending callback gets the typed error:

| how the stream ended                  | error given to pending requests           |
|---------------------------------------|-------------------------------------------|
| UNIMPLEMENTED (an older broker)       | ``StreamUnsupportedError``: resend unary  |
| other gRPC status, or the broker ends | ``BrokerConnectionError`` (retriable)     |
| it (OK) with requests unanswered      |                                           |
| a request older than its deadline     | ``RequestTimedOutError`` (retriable)      |
| ``close``                             | ``BrokerConnectionError``                 |

A broken stream takes no more requests (``send`` returns False); the owner
opens a new one. Requests already on a broken stream are not resent here: the
owner's retry rules decide, exactly as for a unary call that failed in transport.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable

import grpc

from client.metadata import Address, BrokerConnectionError, format_address, rpc_error_to_typed
from proto.errors import RequestTimedOutError, TidewaterError

log = logging.getLogger("tidewater.client.streams")

# A callback gets (response, None) or (None, error); it runs on the stream's reader thread.
Callback = Callable[[object, TidewaterError | None], None]

_CLOSE = object()  # the outbox's end marker: half-close the stream


class StreamUnsupportedError(BrokerConnectionError):
    """The broker does not implement the stream (UNIMPLEMENTED): use the unary call."""


class ClientStream:
    """One bidi stream to one broker.

    ProduceStream (``ordered`` False): answers come by ``correlation_id``, possibly out of
    order; a reader thread of the stream calls each request's callback. FetchStream
    (``ordered``): answers come in request order, and the thread waiting for one
    (``StreamRequest.result``) reads them itself: no reader thread, one thread hand-off
    less per round trip."""

    def __init__(self, method, address: Address, *, ordered: bool, name: str):
        self.address = address
        self._ordered = ordered
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        # correlation id -> (callback, deadline on the monotonic clock); insertion order is
        # send order, so the first entry is the oldest request.
        self._pending: dict[int, tuple[Callback, float]] = {}
        self._ids = itertools.count(1)
        self._broken: TidewaterError | None = None
        self._call = method(self._requests())
        self._responses = iter(self._call)
        self._read_lock = threading.Lock()  # ordered: one thread reads at a time
        self._reader: threading.Thread | None = None
        if not ordered:
            self._reader = threading.Thread(target=self._read_all, daemon=True,
                                            name=f"tide-{name}-{format_address(address)}")
            self._reader.start()

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def send(self, request, callback: Callback, timeout_s: float, *, answered: bool = True) -> bool:
        """Queue ``request`` (its ``correlation_id`` is set here, for a ProduceStream); False
        when the stream is broken (nothing queued). An unanswered request (acks=0) gets
        its callback at once with None."""
        with self._lock:
            if self._broken is not None:
                return False
            correlation_id = next(self._ids)
            if not self._ordered:
                request.correlation_id = correlation_id
            if answered:
                self._pending[correlation_id] = (callback, time.monotonic() + timeout_s)
            self._outbox.put(request)
        if not answered:
            callback(None, None)
        return True

    def expire(self, now_s: float) -> None:
        """Break the stream when its oldest unanswered request is past its deadline (a hung
        broker): as a unary call would, the requests fail with RequestTimedOutError."""
        with self._lock:
            oldest = next(iter(self._pending.values()), None)
        if oldest is not None and oldest[1] <= now_s:
            self._break(RequestTimedOutError(
                f"request to {format_address(self.address)} timed out on its stream"))

    def close(self, timeout_s: float = 5.0) -> None:
        """Half-close: the broker answers what it has and ends the stream (a ProduceStream's
        reader waits for that up to ``timeout_s``); then anything still pending fails."""
        self._outbox.put(_CLOSE)
        if self._reader is not None:
            self._reader.join(timeout_s)
        self._break(BrokerConnectionError(f"stream to {format_address(self.address)} closed"))

    def abort(self, error: TidewaterError) -> None:
        """Break the stream now: pending requests fail with ``error``."""
        self._break(error)

    def read_until(self, done: Callable[[], bool]) -> None:
        """Ordered streams: read answers in this thread until ``done()`` (or the stream breaks)."""
        with self._read_lock:
            while not done():
                if self._broken is not None:
                    return  # _break answered every pending request
                try:
                    response = next(self._responses)
                except StopIteration:
                    self._break(self._ended())
                    return
                except Exception as e:  # noqa: BLE001 - typed below; never leave waiters hanging
                    self._break(self._error_for(e))
                    return
                self._dispatch(response)

    def _requests(self):
        """The request iterator, consumed by a gRPC thread."""
        while (request := self._outbox.get()) is not _CLOSE:
            yield request

    def _read_all(self) -> None:
        """The reader thread of an unordered stream."""
        try:
            for response in self._responses:
                self._dispatch(response)
            error = self._ended()
        except Exception as e:  # noqa: BLE001 - typed below; never leave callbacks hanging
            error = self._error_for(e)
        self._break(error)

    def _dispatch(self, response) -> None:
        with self._lock:
            if self._ordered:
                entry = self._pending.pop(next(iter(self._pending))) if self._pending else None
            else:
                entry = self._pending.pop(response.correlation_id, None)
        if entry is not None:
            self._answer(entry[0], response, None)

    def _ended(self) -> TidewaterError:
        return BrokerConnectionError(f"broker {format_address(self.address)} ended the stream")

    def _error_for(self, e: Exception) -> TidewaterError:
        if self._broken is not None:
            return self._broken  # we cancelled the call (timeout, close)
        if isinstance(e, grpc.RpcError):
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return StreamUnsupportedError(
                    f"broker {format_address(self.address)} has no stream: {e.details()}")
            error = rpc_error_to_typed(e, self.address)
            if isinstance(error, (BrokerConnectionError, RequestTimedOutError)):
                return error
            return BrokerConnectionError(str(error))
        return BrokerConnectionError(f"stream to {format_address(self.address)} failed: {e!r}")

    def _break(self, error: TidewaterError) -> None:
        with self._lock:
            if self._broken is None:
                self._broken = error
            pending, self._pending = self._pending, {}
        if pending:
            self._call.cancel()
        self._outbox.put(_CLOSE)  # ends the request iterator (its gRPC thread)
        for callback, _ in pending.values():
            self._answer(callback, None, error)

    @staticmethod
    def _answer(callback: Callback, response, error: TidewaterError | None) -> None:
        try:
            callback(response, error)
        except Exception:  # noqa: BLE001 - a callback bug must not stop the reader
            log.exception("stream callback failed")


class StreamRequest:
    """A request on an ordered stream that its caller waits for (``result``)."""

    __slots__ = ("stream", "request", "_answered", "_response", "_error")

    def __init__(self, stream: ClientStream, request):
        self.stream = stream
        self.request = request
        self._answered = False
        self._response = None
        self._error: TidewaterError | None = None

    def on_answer(self, response, error: TidewaterError | None) -> None:
        self._response, self._error = response, error
        self._answered = True

    def result(self):
        """The response; raises the stream's typed error (RequestTimedOutError once the
        request is past its deadline: the pool's watchdog breaks the stream)."""
        self.stream.read_until(lambda: self._answered)
        if self._error is not None:
            raise self._error
        if not self._answered:
            raise BrokerConnectionError("stream broke before the answer")
        return self._response

    def cancel(self) -> None:
        """Not wanted after all: its answer (the stream keeps its order) is dropped."""


class StreamPool:
    """One stream per broker address for one RPC of a client; remembers brokers without it.

    A watchdog thread (every ``WATCHDOG_INTERVAL_S``) breaks streams whose oldest request
    is past its deadline, so a hung broker fails requests as a unary deadline would."""

    WATCHDOG_INTERVAL_S = 0.5

    def __init__(self, pool, name: str, *, ordered: bool):
        self._pool = pool  # client.metadata.ChannelPool
        self._name = name
        self._ordered = ordered
        self._lock = threading.Lock()
        self._streams: dict[Address, ClientStream] = {}
        self._unsupported: set[Address] = set()
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None

    def stream(self, address: Address) -> ClientStream | None:
        """The open stream to ``address`` (opened now if none or broken); None when the
        broker lacks the RPC or the pool is closed."""
        if address in self._unsupported:
            return None
        stream = self._streams.get(address)
        if stream is not None and not stream.broken:
            return stream
        with self._lock:
            if self._closed.is_set() or address in self._unsupported:
                return None
            stream = self._streams.get(address)
            if stream is not None and isinstance(stream._broken, StreamUnsupportedError):
                # The broker lacks the RPC (its requests were answered with this error,
                # and their owners resend them unary): no stream to it from now on.
                self._unsupported.add(address)
                return None
            if stream is None or stream.broken:
                method = getattr(self._pool.broker(address), self._name)
                stream = self._streams[address] = ClientStream(
                    method, address, ordered=self._ordered, name=self._name)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                  name=f"tide-{self._name}-watchdog")
                self._watchdog.start()
            return stream

    def _watch(self) -> None:
        while not self._closed.wait(self.WATCHDOG_INTERVAL_S):
            now_s = time.monotonic()
            for stream in list(self._streams.values()):
                stream.expire(now_s)

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._closed.set()
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:
            stream.close(timeout_s)
        if self._watchdog is not None:
            self._watchdog.join(timeout_s)
