"""InitProducerId: producer ids for idempotent producers, from blocks the controller gives.

As Kafka's RPCProducerIdManager (KIP-730): the broker hands out ids from its
current block; when 90% of it is used it asks the controller for the next
block in the background (``AllocateProducerIds``), so a producer rarely waits.
The controller records every block in its metadata log before answering, so
an id is never handed out twice, across broker and controller restarts (the
unused rest of a block is simply skipped). With no id left and no block yet,
InitProducerId waits up to ``INIT_WAIT_MS_MAX`` for one, then answers
COORDINATOR_LOAD_IN_PROGRESS (retriable), as Kafka does.

A producer without a transactional id always gets a new id with epoch 0 (Kafka
does the same, also for v3+ requests naming their current id and epoch: an
idempotent producer bumps its epoch itself). A transactional id is the transaction
coordinator's (``txn_apis.init_transactional_producer``, called first by both listeners):
one that reaches here is INVALID_REQUEST.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    CoordinatorLoadInProgressError,
    InvalidRequestError,
    InvariantViolation,
    TidewaterError,
    error_for_code,
)
from tidewater.proto.supervisor import TaskSupervisor

log = logging.getLogger(__name__)

PREFETCH_FRACTION = 0.9  # Kafka asks for the next block when 90% of the current one is used
INIT_WAIT_MS_MAX = 5000
RETRY_BACKOFF_MS = 500

AllocateRpc = Callable[[], Awaitable[pb.AllocateProducerIdsResponse]]


class ProducerIdBlocks:
    """The ids at hand (pure): the current block and at most one block fetched ahead."""

    def __init__(self) -> None:
        self._next = 0
        self._end = 0  # exclusive
        self._prefetch_at = 0
        self._ahead: tuple[int, int] | None = None

    def take(self) -> int | None:
        """The next id, or None when none is at hand."""
        if self._next >= self._end and self._ahead is not None:
            self._use(*self._ahead)
            self._ahead = None
        if self._next >= self._end:
            return None
        producer_id = self._next
        self._next += 1
        return producer_id

    def wants_block(self) -> bool:
        return self._ahead is None and self._next >= self._prefetch_at

    def on_block(self, start: int, length: int) -> None:
        if length <= 0 or start < 0:
            raise InvalidRequestError(f"controller gave an empty block {start}+{length}")
        if self._next >= self._end:
            self._use(start, length)
        else:
            self._ahead = (start, length)

    def _use(self, start: int, length: int) -> None:
        self._next, self._end = start, start + length
        self._prefetch_at = start + int(length * PREFETCH_FRACTION)


class ProducerIdManager:
    """The shell: asks the controller for blocks (one request at a time) and answers
    InitProducerId."""

    def __init__(self, allocate: AllocateRpc | None, supervisor: TaskSupervisor):
        self._allocate = allocate
        self._supervisor = supervisor  # runs the asking task: a bug there stops the broker
        self._blocks = ProducerIdBlocks()
        self._fetching: asyncio.Task[None] | None = None
        self._got_block = asyncio.Event()

    async def init_producer_id(self, request: pb.InitProducerIdRequest) -> pb.InitProducerIdResponse:
        try:
            if request.transactional_id:
                raise InvalidRequestError("a transactional id is the transaction "
                                          f"coordinator's ({request.transactional_id!r})")
            if (request.producer_id < 0) != (request.producer_epoch < 0):
                raise InvalidRequestError("producer id and epoch must both be given or neither")
            producer_id = await self.next_producer_id()
        except TidewaterError as e:
            return pb.InitProducerIdResponse(error_code=e.error_code, error_message=str(e),
                                             producer_id=-1, producer_epoch=-1)
        return pb.InitProducerIdResponse(error_code=pb.NONE, producer_id=producer_id,
                                         producer_epoch=0)

    async def next_producer_id(self) -> int:
        deadline = asyncio.get_running_loop().time() + INIT_WAIT_MS_MAX / 1000
        while True:
            producer_id = self._blocks.take()
            if self._blocks.wants_block():
                self._maybe_fetch()
            if producer_id is not None:
                return producer_id
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise CoordinatorLoadInProgressError("no producer id block from the controller yet")
            self._got_block.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._got_block.wait()
            except TimeoutError:
                pass

    def _maybe_fetch(self) -> None:
        if self._fetching is not None or self._allocate is None:
            return
        self._fetching = self._supervisor.spawn(self._fetch(), "allocate-producer-ids")

    async def _fetch(self) -> None:
        """Ask until a block comes (each failure logged); then wake the waiting callers."""
        if self._allocate is None:
            raise InvariantViolation("asking for producer ids with no controller to ask")
        try:
            while True:
                try:
                    response = await self._allocate()
                    if response.error_code == pb.NONE:
                        self._blocks.on_block(response.producer_id_start, response.producer_id_len)
                        log.info("producer id block %d..%d", response.producer_id_start,
                                 response.producer_id_start + response.producer_id_len - 1)
                        return
                    log.warning("AllocateProducerIds refused: %s",
                                error_for_code(response.error_code))
                except TidewaterError as e:
                    log.warning("AllocateProducerIds: %s", e)
                except InvariantViolation:
                    raise  # a bug: the supervisor stops the broker
                except Exception as e:  # the controller unreachable (grpc.aio.AioRpcError)
                    log.warning("AllocateProducerIds failed: %s", e)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
        finally:
            self._fetching = None
            self._got_block.set()

    async def stop(self) -> None:
        task = self._fetching
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
