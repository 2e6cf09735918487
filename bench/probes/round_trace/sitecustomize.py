"""Timestamps at the hops of an acks=all round, for ``bench/probes/round_timeline.py``.

Loaded by every Python process started with this folder on ``PYTHONPATH`` (the
brokers, the latency receiver); it does nothing unless ``TIDEWATER_ROUND_TRACE`` names a
folder. Then, as the modules below are imported, it wraps a few functions so each call
appends ``(perf_counter_ns, event, value)`` to a list, flushed every 0.25 s and at exit
to ``<folder>/<pid>.trace`` (``perf_counter`` is CLOCK_MONOTONIC: one clock for every
process on the machine). Each wrapper costs a call and a tuple (~1 µs), a little
beside the rounds of ~1-3 ms it times. Probe code only: no product module imports it.
"""

from __future__ import annotations

import atexit
import functools
import os
import struct
import sys
import threading
import time

_FOLDER = os.environ.get("TIDEWATER_ROUND_TRACE")
_events: list[tuple[int, str, int]] = []
_clock = time.perf_counter_ns


def event(name: str, value: int = 0) -> None:
    _events.append((_clock(), name, value))


def _last_offset_delta(records: bytes) -> int:
    """The last_offset_delta of the last batch in ``records`` (Kafka's v2 batch header)."""
    position, last = 0, 0
    view = memoryview(records)
    while position + 61 <= len(view):
        length = struct.unpack_from(">i", view, position + 8)[0]
        last = struct.unpack_from(">i", view, position + 23)[0]
        position += 12 + length
    return last


def _patch_grpc_server(module) -> None:
    from tidewater.proto import tidewater_pb2 as pb

    reader = module._StreamReader
    read = reader.read

    @functools.wraps(read)
    async def traced_read(self):
        request = await read(self)
        if isinstance(request, pb.ProduceRequest):
            event("P_in", len(request.partitions))
        elif isinstance(request, pb.FetchRequest) and request.partitions:
            offset = request.partitions[0].fetch_offset
            event(f"F_in{request.replica_id}" if request.replica_id >= 0 else "C_in", offset)
        return request
    reader.read = traced_read

    encode = module.encode_fetch_response

    def traced_encode(results, *args, **kwargs):
        event("RF_enc", len(results))
        return encode(results, *args, **kwargs)
    module.encode_fetch_response = traced_encode

    writer = module._AnswerWriter
    write = writer.write

    @functools.wraps(write)
    async def traced_write(self, response, started):
        base = response.partitions[0].base_offset if response.partitions else -1
        event("P_wr0", base)
        await write(self, response, started)
        event("P_wr1", base)
    writer.write = traced_write

    send_later = writer.send_later

    def traced_send_later(self, response, started):
        event("P_later", response.partitions[0].base_offset if response.partitions else -1)
        return send_later(self, response, started)
    writer.send_later = traced_send_later


def _patch_replica_manager(module) -> None:
    manager = module.ReplicaManager
    append = manager.produce_append

    @functools.wraps(append)
    async def traced_append(self, request):
        result = await append(self, request)
        response = result[0]
        if response.partitions and request.partitions:
            base = response.partitions[0].base_offset
            event("P_app", base)
            event("P_last", base + _last_offset_delta(request.partitions[0].records))
        return result
    manager.produce_append = traced_append

    fetch = manager.fetch

    @functools.wraps(fetch)
    async def traced_fetch(self, request):
        response = await fetch(self, request)
        event("C_ready", len(response.partitions[0].records) if response.partitions else 0)
        return response
    manager.fetch = traced_fetch

    fetch_partitions = manager.fetch_partitions

    @functools.wraps(fetch_partitions)
    async def traced_fetch_partitions(self, request, *args):
        # ``*args``: a ReplicaFetch stream's fetch session. Taking only the request
        # refused every session fetch with a TypeError: the followers fetched nothing,
        # the ISR shrank to the leader and the probe timed an unreplicated round.
        event("RF_start", request.replica_id)
        response = await fetch_partitions(self, request, *args)
        event("RF_ready", request.replica_id)
        return response
    manager.fetch_partitions = traced_fetch_partitions


def _patch_fetcher(module) -> None:
    fetcher = module.LeaderFetcher
    checked = fetcher._checked

    def traced_checked(self, response):
        event("FA_in")
        return checked(self, response)
    fetcher._checked = traced_checked

    apply = fetcher._apply_response

    @functools.wraps(apply)
    async def traced_apply(self, *args):
        await apply(self, *args)
        event("FA_done")
    fetcher._apply_response = traced_apply

    fetch_request = fetcher._fetch_request

    def traced_fetch_request(self, fetching):
        request, sent = fetch_request(self, fetching)
        event("F_out", request.partitions[0].fetch_offset if request.partitions else -1)
        return request, sent
    fetcher._fetch_request = traced_fetch_request


def _patch_streams(module) -> None:
    stream = module.ClientStream
    send = stream.send

    def traced_send(self, request, *args, **kwargs):
        event("S_req")
        return send(self, request, *args, **kwargs)
    stream.send = traced_send

    dispatch = stream._dispatch

    def traced_dispatch(self, response):
        event("S_ans")
        return dispatch(self, response)
    stream._dispatch = traced_dispatch


def _patch_consumer(module) -> None:
    consumer = module.Consumer
    read_answer = consumer.read_fetch_answer

    def traced_read_answer(self, *args, **kwargs):
        event("C_ans")
        return read_answer(self, *args, **kwargs)
    consumer.read_fetch_answer = traced_read_answer


PATCHES = {
    "tidewater.broker.servicers.grpc_server": _patch_grpc_server,
    "tidewater.broker.replicas.replica_manager": _patch_replica_manager,
    "tidewater.broker.following.fetcher": _patch_fetcher,
    "tidewater.client.streams": _patch_streams,
    "tidewater.client.consumer": _patch_consumer,
}


class _PatchingFinder:
    """Finds the modules in PATCHES through the other finders and patches each once
    it has run."""

    def find_spec(self, name, path=None, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def patched_exec(module):
            exec_module(module)
            patch(module)
        loader.exec_module = patched_exec
        return spec


def _flush() -> None:
    if not _events:
        return
    taken = _events[:]
    del _events[:len(taken)]
    with open(os.path.join(_FOLDER, f"{os.getpid()}.trace"), "a") as out:
        out.writelines(f"{t} {name} {value}\n" for t, name, value in taken)


def _flusher() -> None:
    while True:
        time.sleep(0.25)
        _flush()


def install() -> None:
    sys.meta_path.insert(0, _PatchingFinder())
    atexit.register(_flush)
    threading.Thread(target=_flusher, name="round-trace-flush", daemon=True).start()


if _FOLDER:
    install()
    # The role, so the reader can tell the processes apart.
    event("argv:" + " ".join(sys.argv[:3]).replace(" ", "_"))
