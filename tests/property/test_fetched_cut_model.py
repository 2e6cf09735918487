"""Property test: a follower's real ``Log`` takes fetched chunks through
``fetched_from_log_end`` (broker/replication/follower.py), as the shell's
``AppendFetched`` does, whatever batch boundaries its own log has.

The follower holds the leader's first records (same offsets and epochs), batched
differently; the leader answers each fetch with whole batches from the one holding
the fetch offset, a few at a time. Fetch rounds run until the follower's LEO is the
leader's. Checked: no append is refused (every append starts exactly at the LEO),
the rounds end, and the follower's log then holds every offset the leader has,
contiguous, with the leader's epochs.
"""

import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.property.test_log_model import _no_fsync  # noqa: F401  (autouse: no fsync)
from tidewater.broker.replication.follower import fetched_from_log_end
from tidewater.broker.storage.log import Log
from tidewater.broker.storage.log_config import LogConfig
from tidewater.proto.batch import iter_batches
from tidewater.proto.records import encode_batch

CONFIG = LogConfig(segment_bytes=2_000, index_interval_bytes=90, retention_ms=-1)


def encode(base_offset: int, count: int, epoch: int) -> bytes:
    return encode_batch([(None, b"r%d" % (base_offset + i)) for i in range(count)],
                        base_offset=base_offset, partition_leader_epoch=epoch,
                        base_timestamp_ms=1_000)


def layout(counts: list[int], epoch_of) -> list[tuple[int, int, int]]:
    """(base_offset, count, epoch) of consecutive batches; a batch never spans epochs
    (``epoch_of(offset)``): it is cut where the epoch changes."""
    out, offset = [], 0
    for count in counts:
        while count > 0:
            epoch = epoch_of(offset)
            n = 1
            while n < count and epoch_of(offset + n) == epoch:
                n += 1
            out.append((offset, n, epoch))
            offset += n
            count -= n
    return out


def append_fetched(log: Log, chunk: bytes) -> None:
    """What the shell's ``AppendFetched`` does with a chunk (the core's decision)."""
    cut = fetched_from_log_end(((p, h.base_offset, h.next_offset)
                                for p, h in iter_batches(chunk, validate=False)),
                               log.log_end_offset)
    if cut.truncate_to is not None:
        log.truncate_to(cut.truncate_to)
    start = cut.append_from(log.log_end_offset)
    if start is not None:
        log.append_as_follower(chunk[start:], 0)


@settings(max_examples=60, deadline=None)
@given(leader_counts=st.lists(st.integers(1, 6), min_size=1, max_size=10),
       follower_counts=st.lists(st.integers(1, 6), max_size=10),
       epoch_starts=st.lists(st.integers(1, 40), max_size=3),
       batches_per_answer=st.integers(1, 4))
def test_follower_takes_fetched_chunks_whatever_its_batch_boundaries(
        leader_counts, follower_counts, epoch_starts, batches_per_answer):
    starts = sorted(set(epoch_starts))

    def epoch_of(offset: int) -> int:
        return sum(1 for s in starts if s <= offset)

    leader = layout(leader_counts, epoch_of)
    leader_end = leader[-1][0] + leader[-1][1]
    # The follower holds a prefix of the leader's records, batched its own way.
    follower = [b for b in layout(follower_counts, epoch_of) if b[0] + b[1] <= leader_end]
    tmp = tempfile.mkdtemp()
    log = Log.open(Path(tmp) / "t-0", CONFIG, now_ms=0)
    try:
        for base_offset, count, epoch in follower:
            log.append_as_follower(encode(base_offset, count, epoch), 0)
        for _ in range(2 * len(leader) + 2):
            fetch_offset = log.log_end_offset
            if fetch_offset == leader_end:
                break
            first = next(i for i, b in enumerate(leader) if b[0] + b[1] > fetch_offset)
            chunk = b"".join(encode(*b) for b in leader[first:first + batches_per_answer])
            append_fetched(log, chunk)
        assert log.log_end_offset == leader_end, "the fetch rounds did not converge"
        read = log.read(0, 1 << 20)
        held = [(h.base_offset, h.next_offset, h.partition_leader_epoch)
                for _, h in iter_batches(bytes(read.records))]
        assert held[0][0] == 0 and held[-1][1] == leader_end
        assert all(a[1] == b[0] for a, b in zip(held, held[1:], strict=False)), held
        assert all(epoch == epoch_of(base) for base, _, epoch in held), held
    finally:
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
