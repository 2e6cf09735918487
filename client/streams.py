"""Client ends of the ProduceStream and FetchStream RPCs: one long-lived stream per broker.

A message on an open gRPC stream costs about half the CPU of a unary call on
both sides (a ping-pong microbenchmark: unary 490-620 µs per round trip over
client and broker, a bidi stream 215-257 µs), which is most of a record's cost
at moderate rates with one record per request.

Theory of operation. The streams run on grpc.aio, on one asyncio (uvloop) loop
in one daemon thread per process, ``tide-client-io`` (``IoLoop``): a trivial
echo costs the sync stream API 263 µs of client CPU per round trip (a gRPC
thread consumes the request iterator, another thread reads answers: two thread
hand-offs per message) and grpc.aio 148 µs. One loop per process rather than
per client: one thread wakes for the answers of every client of the process,
and gRPC binds each aio channel to the loop that made it. The first
``StreamPool`` that opens a stream starts the loop; the last one to close
stops it and joins its thread (no thread or loop outlives the clients). A
forked child forgets its parent's loop and starts its own. An asyncio client
(``client.aio_producer``) gives its pool a ``CallerLoop`` instead: its streams
run on its own event loop, answers reach it with no thread hand-off, and it
closes the pool with ``aclose`` on that loop.

The caller's thread and the loop meet in ``ClientStream.send``: under the
stream's lock the request is registered (callback, deadline) and appended to
the outbox; the loop is woken with one ``call_soon_threadsafe`` only when the
stream's writer task sleeps (requests sent while it writes go with it, no
wake-up at all). The writer writes the outbox in order; the reader task reads
answers and calls each request's callback on the loop thread, matched by
``correlation_id`` for ProduceStream, in order for FetchStream. A callback must
not block for long: it holds up every stream of the process. Once the stream
breaks, every pending callback gets the typed error:

| how the stream ended                  | error given to pending requests           |
|---------------------------------------|-------------------------------------------|
| UNIMPLEMENTED (the server lacks the   | ``UnsupportedVersionError`` (not          |
| RPC: not a broker of this release)    | retriable)                                |
| other gRPC status, or the broker ends | ``BrokerConnectionError`` (retriable)     |
| it (OK) with requests unanswered      |                                           |
| a request older than its deadline     | ``RequestTimedOutError`` (retriable)      |
| ``close``                             | ``BrokerConnectionError``                 |

A broken stream takes no more requests (``send`` returns False); the owner
opens a new one. Requests already on a broken stream are not resent here: the
owner's retry rules decide, exactly as for a unary call that failed in transport.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from enum import Enum
from typing import Any, Generic, Literal, Protocol, TypeVar, TypeVarTuple, cast

import grpc
from google.protobuf.message import Message

from tidewater.client.metadata import (
    CHANNEL_OPTIONS,
    Address,
    BrokerConnectionError,
    format_address,
    rpc_error_to_typed,
)
from tidewater.client.security import PLAINTEXT, ClientSecurity, aio_channel
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import RequestTimedOutError, TidewaterError, UnsupportedVersionError

log = logging.getLogger("tidewater.client.streams")

_Req = TypeVar("_Req", bound=Message)  # a stream's requests (ProduceRequest, FetchRequest)
_Resp = TypeVar("_Resp", bound=Message)  # and its answers
_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

# A callback gets (response, None) or (None, error). It runs on the loop thread (an answer,
# a broken stream) or on the thread that broke the stream (close, abort).
Callback = Callable[[_Resp | None, TidewaterError | None], None]


class _Correlated(Protocol):
    """The requests and answers of an unordered stream (ProduceStream) carry an id."""

    correlation_id: int


class _Close(Enum):
    CLOSE = "close"


_CLOSE = _Close.CLOSE  # the outbox's end marker: half-close the stream

# ---------------------------------------------------------------------- the process's I/O loop


def _call_soon(loop: asyncio.AbstractEventLoop, thread: threading.Thread,
               fn: Callable[[*_Ts], object], *args: *_Ts) -> None:
    """Run ``fn(*args)`` on ``loop``, whose thread is ``thread``. From that thread itself
    (a Producer sending from an answer) without ``call_soon_threadsafe``'s self-pipe
    write: two system calls and a loop pass less. A closed loop drops it."""
    try:
        if threading.current_thread() is thread:
            loop.call_soon(fn, *args)
        else:
            loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: nothing there to do
        pass


class _LoopAccess:
    """What a ``ClientStream`` and a ``StreamPool`` need of a loop: ``loop``, its
    ``thread``, ``call_soon`` and ``in_loop_thread`` (``IoLoop``, ``CallerLoop``)."""

    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def call_soon(self, fn: Callable[[*_Ts], object], *args: *_Ts) -> None:
        """Run ``fn(*args)`` on the loop (from any thread); a closed loop drops it."""
        _call_soon(self.loop, self.thread, fn, *args)


class IoLoop(_LoopAccess):
    """One asyncio loop in one daemon thread, shared by the StreamPools of a process
    (``acquire`` / ``release`` count its users; the last release stops it)."""

    STOP_TIMEOUT_S = 5.0

    _lock = threading.Lock()
    _shared: IoLoop | None = None
    _users = 0

    def __init__(self) -> None:
        try:
            import uvloop
            self.loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency
            self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, name="tide-client-io", daemon=True)
        self.thread.start()
        self._started.wait()

    @classmethod
    def acquire(cls) -> IoLoop:
        with cls._lock:
            if cls._shared is None:
                cls._shared = IoLoop()
            cls._users += 1
            return cls._shared

    @classmethod
    def release(cls, io: IoLoop) -> None:
        with cls._lock:
            if io is not cls._shared:
                return  # a loop forgotten at fork
            cls._users -= 1
            if cls._users > 0:
                return
            cls._shared = None
        io._stop()

    @classmethod
    def _forget_after_fork(cls) -> None:
        """In a forked child the parent's loop thread does not exist: start afresh."""
        cls._lock = threading.Lock()
        cls._shared = None
        cls._users = 0

    def run(self, coro: Coroutine[Any, Any, _T], timeout_s: float) -> _T:
        """Run ``coro`` on the loop and wait for it (never from the loop thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
            # Whatever is left (a reader on a call gRPC is still cancelling) ends now.
            tasks = asyncio.all_tasks(self.loop)
            for task in tasks:
                task.cancel()
            if tasks:
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def _stop(self) -> None:
        self.call_soon(self.loop.stop)
        if not self.in_loop_thread():  # stopped from a callback: the thread ends after it
            self.thread.join(self.STOP_TIMEOUT_S)


os.register_at_fork(after_in_child=IoLoop._forget_after_fork)


class CallerLoop(_LoopAccess):
    """The caller's own running asyncio loop, in the shape of an ``IoLoop``, for asyncio
    clients (``client.aio_producer``) whose streams run on their own loop, not on
    ``tide-client-io``. Nothing to start or stop."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self.loop = loop or asyncio.get_running_loop()
        self.thread = threading.current_thread()


# ---------------------------------------------------------------------- one stream


class ClientStream(Generic[_Req, _Resp]):
    """One bidi stream to one broker, on the I/O loop.

    ProduceStream (``ordered`` False): answers come by ``correlation_id``, possibly out
    of order. FetchStream (``ordered``): answers come in request order. Either way the
    reader task calls each request's callback on the loop thread."""

    def __init__(self, io: _LoopAccess, open_call: Callable[[], grpc.aio.StreamStreamCall[_Req, _Resp]],
                 address: Address, *, ordered: bool, rpc: str = "stream") -> None:
        self.address = address
        self.rpc = rpc  # its RPC's name, for errors
        self._io = io
        self._ordered = ordered
        self._lock = threading.Lock()
        # correlation id -> (callback, deadline on the monotonic clock); insertion order is
        # send order, so the first entry is the oldest request.
        self._pending: dict[int, tuple[Callback[_Resp], float]] = {}
        self._ids = itertools.count(1)
        self._broken: TidewaterError | None = None
        # Requests (and _CLOSE) for the writer task; deque appends and pops are atomic.
        self._outbox: collections.deque[_Req | Literal[_Close.CLOSE]] = collections.deque()
        # The writer sleeps on _wake (True: a sender must wake it, under _lock). It starts
        # busy: _start writes whatever was queued before the call opened.
        self._writer_idle = False
        self._wake: asyncio.Future[None] | None = None
        self._half_closed = False
        self._call: grpc.aio.StreamStreamCall[_Req, _Resp] | None = None  # loop thread only
        self._tasks: tuple[asyncio.Task[None], ...] = ()  # its writer and reader (they end with it)
        self._reader_done = threading.Event()
        io.call_soon(self._start, open_call)

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def send(self, request: _Req, callback: Callback[_Resp], timeout_s: float, *,
             answered: bool = True) -> bool:
        """Queue ``request`` (its ``correlation_id`` is set here, for a ProduceStream); False
        when the stream is broken (nothing queued). An unanswered request (acks=0) gets
        its callback at once with None."""
        with self._lock:
            if self._broken is not None:
                return False
            correlation_id = next(self._ids)
            if not self._ordered:
                cast(_Correlated, request).correlation_id = correlation_id
            if answered:
                self._pending[correlation_id] = (callback, time.monotonic() + timeout_s)
            self._outbox.append(request)
            wake, self._writer_idle = self._writer_idle, False
        if wake:
            self._io.call_soon(self._wake_writer)
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

    def half_close(self) -> None:
        """No more requests: the writer half-closes after what is queued (acks=0 requests
        still queued are sent first) and the broker ends the stream once it has answered."""
        with self._lock:
            if self._half_closed:
                return
            self._half_closed = True
            self._outbox.append(_CLOSE)
            wake, self._writer_idle = self._writer_idle, False
        if wake:
            self._io.call_soon(self._wake_writer)

    def wait_ended(self, timeout_s: float) -> bool:
        """Wait (not on the loop thread) until the reader has seen the stream's end."""
        return self._reader_done.wait(timeout_s)

    async def wait_ended_on_loop(self, timeout_s: float) -> bool:
        """``wait_ended`` for a coroutine on the stream's own loop (``CallerLoop``)."""
        deadline_s = time.monotonic() + timeout_s
        while not self._reader_done.is_set():
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                return False
            if self._tasks:  # opened: its reader ends with the call
                await asyncio.wait(self._tasks[1:], timeout=remaining_s)
            else:  # _start has not run yet (it is queued on this loop)
                await asyncio.sleep(0)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Half-close; a ProduceStream waits up to ``timeout_s`` for the broker to answer
        what it has and end the stream; then anything still pending fails."""
        self.half_close()
        if not self._ordered and not self._io.in_loop_thread():
            self.wait_ended(timeout_s)
        self._break(BrokerConnectionError(f"stream to {format_address(self.address)} closed"))

    def abort(self, error: TidewaterError) -> None:
        """Break the stream now: pending requests fail with ``error``."""
        self._break(error)

    # ------------------------------------------------------------------ on the loop thread

    def _start(self, open_call: Callable[[], grpc.aio.StreamStreamCall[_Req, _Resp]]) -> None:
        if self._broken is not None:
            self._reader_done.set()
            return  # broken before it opened (closed at once)
        try:
            self._call = call = open_call()
        except Exception as e:  # typed below; never leave callbacks hanging
            self._reader_done.set()
            self._break(self._error_for(e))
            return
        loop = self._io.loop
        # The reader breaks the stream however the call ends (every pending callback is
        # answered); the writer ends with the call, or breaks the stream if it fails itself.
        self._tasks = (loop.create_task(self._write_all(call)), loop.create_task(self._read_all(call)))

    def _wake_writer(self) -> None:
        waiter = self._wake
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _write_all(self, call: grpc.aio.StreamStreamCall[_Req, _Resp]) -> None:
        """The writer task: the outbox in order, then sleep until a sender wakes it."""
        outbox, loop = self._outbox, self._io.loop
        try:
            await call.wait_for_connection()  # the call's headers are out
            send = _raw_sender(call)
            while True:
                while outbox:
                    request = outbox.popleft()
                    if request is _CLOSE:
                        await call.done_writing()
                        return
                    if send is not None:
                        await send(request.SerializeToString())
                    else:
                        await call.write(request)
                with self._lock:
                    if outbox:
                        continue
                    self._writer_idle = True
                    self._wake = loop.create_future()
                await self._wake
        except (grpc.RpcError, grpc.aio.InternalError, asyncio.InvalidStateError,
                asyncio.CancelledError):
            pass  # the call ended: the reader reports how (its status)
        except Exception as e:  # a bug: fail the requests now, not at their deadline
            log.exception("stream writer failed")
            self._break(BrokerConnectionError(
                f"stream to {format_address(self.address)} failed: {e!r}"))

    async def _read_all(self, call: grpc.aio.StreamStreamCall[_Req, _Resp]) -> None:
        """The reader task: answers to their callbacks until the stream ends."""
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    error = self._ended()
                    break
                # read() is typed ``object | response`` (EOF is a plain object): an answer.
                self._dispatch(cast(_Resp, response))
        except (Exception, asyncio.CancelledError) as e:  # typed below
            error = self._error_for(e)
        self._break(error)
        self._reader_done.set()

    def _dispatch(self, response: _Resp) -> None:
        with self._lock:
            if self._ordered:
                entry = self._pending.pop(next(iter(self._pending))) if self._pending else None
            else:
                entry = self._pending.pop(cast(_Correlated, response).correlation_id, None)
        if entry is not None:
            self._answer(entry[0], response, None)

    def _cancel_call(self) -> None:
        """Loop thread: cancel the call (its reader and writer end) and wake the writer."""
        if self._call is not None:
            self._call.cancel()
        self._wake_writer()

    # ------------------------------------------------------------------ any thread

    def _ended(self) -> TidewaterError:
        return BrokerConnectionError(f"broker {format_address(self.address)} ended the stream")

    def _error_for(self, e: BaseException) -> TidewaterError:
        if self._broken is not None:
            return self._broken  # we cancelled the call (timeout, close)
        if isinstance(e, grpc.RpcError):
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return UnsupportedVersionError(
                    f"broker {format_address(self.address)} does not implement {self.rpc} "
                    f"(not a Tidewater broker of this release?): {e.details()}")
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
            wake = False
            if not self._half_closed:  # the writer half-closes after what is queued
                self._half_closed = True
                self._outbox.append(_CLOSE)
                wake, self._writer_idle = self._writer_idle, False
        if pending:
            # Unanswered requests: the broker's answers are not wanted any more.
            if self._io.in_loop_thread():
                self._cancel_call()
            else:
                self._io.call_soon(self._cancel_call)
        elif wake:
            self._io.call_soon(self._wake_writer)
        for callback, _ in pending.values():
            self._answer(callback, None, error)

    @staticmethod
    def _answer(callback: Callback[_Resp], response: _Resp | None,
                error: TidewaterError | None) -> None:
        try:
            callback(response, error)
        except Exception:  # a callback bug must not stop the reader
            log.exception("stream callback failed")


def _raw_sender(call: object) -> Callable[[bytes], Awaitable[None]] | None:
    """The call's send of one serialized message, below grpc.aio's ``write``; None when
    this grpc version lacks it (then ``write``).

    ``write`` turns a send that fails in gRPC core into the call's status (INTERNAL,
    "Internal error from Core") and that status then stays, hiding the broker's own:
    a send fails so when the broker has already ended the call, typically a server
    without the RPC answering UNIMPLEMENTED to the call's headers while the first
    request was on its way, which must reach the reader as UNIMPLEMENTED (the
    non-retriable ``UnsupportedVersionError``, not a retriable connection error). Sent
    this way a failed send only ends the writer, and the reader reports the broker's
    status. It also skips ``write``'s per-message checks."""
    cython_call = getattr(call, "_cython_call", None)
    send: Callable[[bytes], Awaitable[None]] | None = getattr(
        cython_call, "send_serialized_message", None)
    return send


class StreamRequest(Generic[_Req, _Resp]):
    """A request on an ordered stream that its caller waits for (``result``): the
    loop thread's answer wakes the waiting thread once (a lock used as a latch)."""

    __slots__ = ("stream", "request", "_latch", "_response", "_error")

    # How often a waiter checks that the loop thread is still alive (it answers every
    # request: the pool's watchdog times out a hung broker's requests).
    LIVENESS_CHECK_S = 1.0

    def __init__(self, stream: ClientStream[_Req, _Resp] | None, request: _Req) -> None:
        """``stream`` None: a request never sent, answered at once (its error)."""
        self.stream = stream
        self.request = request
        self._latch = threading.Lock()
        self._latch.acquire()
        self._response: _Resp | None = None
        self._error: TidewaterError | None = None

    def on_answer(self, response: _Resp | None, error: TidewaterError | None) -> None:
        self._response, self._error = response, error
        self._latch.release()

    def result(self) -> _Resp | None:
        """The response; raises the stream's typed error (RequestTimedOutError once the
        request is past its deadline: the pool's watchdog breaks the stream)."""
        latch = self._latch
        while not latch.acquire(timeout=self.LIVENESS_CHECK_S):
            stream = self.stream
            if stream is not None and not stream._io.thread.is_alive():
                stream.abort(BrokerConnectionError("the client I/O loop stopped"))
                if not latch.acquire(timeout=self.LIVENESS_CHECK_S):
                    raise BrokerConnectionError("the client I/O loop stopped")
                break
        latch.release()  # answered: result() may be asked again
        if self._error is not None:
            raise self._error
        return self._response

    def wait(self, timeout_s: float) -> bool:
        """Whether the answer came within ``timeout_s`` (``result`` then does not block);
        also True when the loop thread is gone (``result`` then raises)."""
        if not self._latch.acquire(timeout=max(0.0, timeout_s)):
            return self.stream is not None and not self.stream._io.thread.is_alive()
        self._latch.release()
        return True

    def done(self) -> bool:
        return self.wait(0)

    def cancel(self) -> None:
        """Not wanted after all: its answer (the stream keeps its order) is dropped."""


# ---------------------------------------------------------------------- one stream per broker


class StreamPool(Generic[_Req, _Resp]):
    """One stream per broker address for one RPC of a client.

    The pool's aio channels (one per broker, separate from the ChannelPool's sync ones
    used for unary calls) live on the I/O loop. A watchdog timer on the loop (every
    ``WATCHDOG_INTERVAL_S``) breaks streams whose oldest request is past its deadline, so
    a hung broker fails requests as a unary deadline would."""

    WATCHDOG_INTERVAL_S = 0.5

    def __init__(self, name: str, *, ordered: bool, io: CallerLoop | None = None,
                 security: ClientSecurity = PLAINTEXT) -> None:
        """``io``: run the streams on that loop (an asyncio client's own, closed with
        ``aclose`` on it) instead of the process's shared ``tide-client-io`` loop.
        ``security``: plaintext or TLS for every channel of the pool (the pool is one
        client's, so clients with other settings never share its channels)."""
        self._name = name
        self.security = security
        self._ordered = ordered
        self._lock = threading.Lock()
        self._streams: dict[Address, ClientStream[_Req, _Resp]] = {}
        self._closed = False
        self._own_io = io
        self._io: IoLoop | CallerLoop | None = None  # acquired by the first stream
        # Loop thread only: address -> (aio channel, stub); the watchdog's timer handle.
        self._channels: dict[Address, tuple[grpc.aio.Channel, pb_grpc.BrokerStub]] = {}
        self._watchdog: asyncio.TimerHandle | None = None

    def stream(self, address: Address) -> ClientStream[_Req, _Resp] | None:
        """The open stream to ``address`` (opened now if none or broken); None once the
        pool is closed. A broker without the RPC breaks each new stream at once with
        ``UnsupportedVersionError``: there is no other way to reach it."""
        stream = self._streams.get(address)
        if stream is not None and not stream.broken:
            return stream
        with self._lock:
            if self._closed:
                return None
            stream = self._streams.get(address)
            if stream is None or stream.broken:
                if self._io is None:
                    self._io = self._own_io or IoLoop.acquire()
                    self._io.call_soon(self._schedule_watchdog)
                stream = self._streams[address] = ClientStream(
                    self._io, lambda: self._open_call(address), address, ordered=self._ordered,
                    rpc=self._name)
            return stream

    def send(self, address: Address, request: _Req, callback: Callback[_Resp], timeout_s: float,
             *, answered: bool = True) -> ClientStream[_Req, _Resp] | None:
        """``ClientStream.send`` on the stream to ``address``, opened anew once when the one
        looked up broke before the send took it; the stream it went on, or None (the pool
        is closed, or no stream took it): the caller fails the request as a transport
        failure."""
        for _ in range(2):
            stream = self.stream(address)
            if stream is None:
                return None
            if stream.send(request, callback, timeout_s, answered=answered):
                return stream
        return None

    def _open_call(self, address: Address) -> grpc.aio.StreamStreamCall[_Req, _Resp]:
        """Loop thread: a new call of the pool's RPC on the broker's aio channel."""
        entry = self._channels.get(address)
        if entry is None:
            channel = aio_channel(format_address(address), self.security, CHANNEL_OPTIONS)
            entry = self._channels[address] = (channel, pb_grpc.BrokerStub(channel))
        # The RPC by its name (the pool's owner names its types: StreamPool[request, answer]).
        call: grpc.aio.StreamStreamCall[_Req, _Resp] = getattr(entry[1], self._name)()
        return call

    def _schedule_watchdog(self) -> None:
        io = self._io
        if not self._closed and io is not None:
            self._watchdog = io.loop.call_later(self.WATCHDOG_INTERVAL_S, self._watch)

    def _watch(self) -> None:
        now_s = time.monotonic()
        for stream in list(self._streams.values()):
            stream.expire(now_s)
        self._schedule_watchdog()

    async def _close_on_loop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        channels, self._channels = list(self._channels.values()), {}
        for channel, _stub in channels:
            await channel.close()  # cancels any call still open

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """``close`` for a pool on a ``CallerLoop``, awaited on that loop: the brokers
        answer what they have (and get the acks=0 requests still queued) before the
        channels close."""
        with self._lock:
            self._closed = True
            streams = list(self._streams.values())
            self._streams.clear()
            opened, self._io = self._io is not None, None
        if not opened:
            return
        deadline_s = time.monotonic() + timeout_s
        for stream in streams:
            stream.half_close()
        for stream in streams:
            await stream.wait_ended_on_loop(max(0.0, deadline_s - time.monotonic()))
            stream.close()  # fails what is still pending
        await self._close_on_loop()

    def close(self, timeout_s: float = 5.0) -> None:
        """Half-close every stream (a ProduceStream's broker answers what it has, for up to
        ``timeout_s``), fail what is left, close the channels and release the loop."""
        with self._lock:
            self._closed = True
            streams = list(self._streams.values())
            self._streams.clear()
            io, self._io = self._io, None
        if io is None:
            return  # never opened a stream
        deadline = time.monotonic() + timeout_s
        for stream in streams:
            stream.half_close()
        for stream in streams:
            stream.close(max(0.0, deadline - time.monotonic()))
        if io.in_loop_thread():  # closed from a callback: finish on the loop, do not wait
            io.loop.create_task(self._close_on_loop())
        elif isinstance(io, IoLoop):  # (a CallerLoop's pool closes with aclose, on its loop)
            try:
                io.run(self._close_on_loop(), max(0.1, deadline - time.monotonic()))
            except Exception:  # a channel that will not close must not stop close
                log.exception("closing the %s channels failed", self._name)
        else:
            log.error("closing the %s channels failed: a pool on its caller's loop closes "
                      "with aclose, on that loop", self._name)
        if isinstance(io, IoLoop):
            IoLoop.release(io)
