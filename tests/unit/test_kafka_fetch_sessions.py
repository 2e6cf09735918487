"""The fetch session cache (broker/kafka/fetch_sessions.py), as Kafka's FetchSessionTest."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidewater.broker.kafka.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    FetchSessionCache,
    FullFetch,
    IncrementalFetch,
    PartitionFetch,
    PartitionKey,
    PartitionOutcome,
    next_epoch,
)
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.errors import (
    FetchSessionIdNotFoundError,
    FetchSessionTopicIdError,
    InvalidFetchSessionEpochError,
)

pytestmark = pytest.mark.timeout(60)


def _ids() -> itertools.count[int]:
    return itertools.count(1)


def cache(slots: int = 10, eviction_ms: int = 1000) -> FetchSessionCache:
    ids = _ids()
    return FetchSessionCache(slots, eviction_ms, new_id=lambda: next(ids))


def wants(*keys: PartitionKey, offset: int = 0) -> dict[PartitionKey, PartitionFetch]:
    return {k: PartitionFetch(offset, 1 << 20) for k in keys}


def outcome(key: PartitionKey, hw: int = 10, lso: int = 0, records: int = 0,
            error: int = pb.NONE) -> PartitionOutcome:
    return PartitionOutcome(key, error, hw, lso, records)


def open_session(c: FetchSessionCache, keys: list[PartitionKey], now_ms: int = 0,
                 hw: int = 10) -> int:
    context = c.new_context(0, INITIAL_EPOCH, wants(*keys), [], uses_topic_ids=False)
    assert isinstance(context, FullFetch)
    return c.complete_full(context, [outcome(k, hw) for k in keys], now_ms)


def incremental(c: FetchSessionCache, session_id: int, epoch: int,
                wanted: dict[PartitionKey, PartitionFetch] | None = None,
                forgotten: list[PartitionKey] | None = None) -> IncrementalFetch:
    context = c.new_context(session_id, epoch, wanted or {}, forgotten or [],
                            uses_topic_ids=False)
    assert isinstance(context, IncrementalFetch)
    return context


A, B, C = ("t", 0), ("t", 1), ("u", 0)


def test_epochs_go_initial_to_one_and_wrap_to_one():
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(5) == 6
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_full_fetch_opens_a_session_whose_next_epoch_is_one():
    c = cache()
    session_id = open_session(c, [A, B])
    session = c.get(session_id)
    assert session_id != 0 and session is not None
    assert session.epoch == 1 and list(session.partitions) == [A, B]
    assert len(c) == 1 and c.partitions_count == 2


def test_final_epoch_is_sessionless_and_closes_the_session_named():
    c = cache()
    session_id = open_session(c, [A])
    context = c.new_context(session_id, FINAL_EPOCH, wants(A), [], uses_topic_ids=False)
    assert isinstance(context, FullFetch) and not context.open_session
    assert c.complete_full(context, [outcome(A)], 0) == 0
    assert c.get(session_id) is None and c.partitions_count == 0
    assert c.counters.sessionless_fetches == 1


def test_initial_epoch_with_an_id_closes_it_and_opens_another():
    c = cache()
    first = open_session(c, [A])
    second = open_session(c, [A, B])
    context = c.new_context(second, INITIAL_EPOCH, wants(C), [], uses_topic_ids=False)
    third = c.complete_full(context, [outcome(C)], 0)  # type: ignore[arg-type]
    assert c.get(second) is None and third not in (0, first, second)
    assert len(c) == 2 and c.partitions_count == 2


def test_unknown_session_and_wrong_epoch_are_kafkas_errors():
    c = cache()
    session_id = open_session(c, [A])
    with pytest.raises(FetchSessionIdNotFoundError) as not_found:
        c.new_context(session_id + 100, 1, {}, [], uses_topic_ids=False)
    assert not_found.value.error_code == 70
    with pytest.raises(InvalidFetchSessionEpochError) as wrong_epoch:
        c.new_context(session_id, 2, {}, [], uses_topic_ids=False)
    assert wrong_epoch.value.error_code == 71
    with pytest.raises(FetchSessionTopicIdError) as topic_ids:
        c.new_context(session_id, 1, {}, [], uses_topic_ids=True)
    assert topic_ids.value.error_code == 106
    assert c.counters.session_errors == 3
    incremental(c, session_id, 1)  # the session survives its errors


def test_incremental_answers_only_what_changed():
    c = cache()
    session_id = open_session(c, [A, B, C], hw=10)
    context = incremental(c, session_id, 1)
    assert [k for k, _ in context.partitions] == [A, B, C]
    # A has records, B nothing new, C's high watermark moved.
    answer = c.complete_incremental(
        context, [outcome(A, records=100), outcome(B), outcome(C, hw=11)], 5)
    assert answer.error_code == pb.NONE and answer.session_id == session_id
    assert answer.listed == [0, 2]
    # A returned records: it goes last (max_bytes shared round-robin).
    assert list(c.get(session_id).partitions) == [B, C, A]  # type: ignore[union-attr]
    # Nothing changed: an empty answer.
    context = incremental(c, session_id, 2)
    answer = c.complete_incremental(context, [outcome(B), outcome(C, hw=11), outcome(A)], 6)
    assert answer.listed == []
    assert c.counters.incremental_fetches == 2


def test_an_error_is_answered_and_the_partition_again_once_it_clears():
    c = cache()
    session_id = open_session(c, [A], hw=10)
    answer = c.complete_incremental(incremental(c, session_id, 1),
                                    [outcome(A, error=pb.NOT_LEADER_OR_FOLLOWER)], 1)
    assert answer.listed == [0]
    # The same high watermark as before the error: still answered, the client must
    # learn the error is gone.
    answer = c.complete_incremental(incremental(c, session_id, 2), [outcome(A, hw=10)], 2)
    assert answer.listed == [0]
    answer = c.complete_incremental(incremental(c, session_id, 3), [outcome(A, hw=10)], 3)
    assert answer.listed == []


def test_log_start_change_and_diverging_epoch_are_answered():
    c = cache()
    session_id = open_session(c, [A, B])
    answer = c.complete_incremental(incremental(c, session_id, 1), [
        outcome(A, lso=5), PartitionOutcome(B, pb.NONE, 10, 0, 0, diverging=True)], 1)
    assert answer.listed == [0, 1]


def test_a_moved_last_stable_offset_is_answered():
    """A transaction ended (its marker written, nothing new to read past it): a
    read_committed consumer must learn the new last stable offset, as Kafka's
    maybeUpdateResponseData compares it too."""
    c = cache()
    session_id = open_session(c, [A, B])
    moved = PartitionOutcome(A, pb.NONE, 10, 0, 0, last_stable_offset=7)
    first = c.complete_incremental(incremental(c, session_id, 1), [
        moved, PartitionOutcome(B, pb.NONE, 10, 0, 0)], 1)
    assert first.listed == [0]
    again = c.complete_incremental(incremental(c, session_id, 2), [
        moved, PartitionOutcome(B, pb.NONE, 10, 0, 0)], 2)
    assert again.listed == []


def test_added_updated_and_forgotten_partitions():
    c = cache()
    session_id = open_session(c, [A, B])
    context = incremental(c, session_id, 1, wanted={**wants(C), **wants(A, offset=7)},
                          forgotten=[B])
    assert dict(context.partitions) == {A: PartitionFetch(7, 1 << 20),
                                        C: PartitionFetch(0, 1 << 20)}
    # C is new: never answered, so its high watermark is news.
    answer = c.complete_incremental(context, [outcome(A), outcome(C)], 1)
    assert answer.listed == [1]
    assert c.partitions_count == 2


def test_forgetting_every_partition_closes_the_session():
    c = cache()
    session_id = open_session(c, [A])
    context = c.new_context(session_id, 1, {}, [A], uses_topic_ids=False)
    assert isinstance(context, FullFetch) and not context.open_session
    assert c.get(session_id) is None and len(c) == 0 and c.partitions_count == 0


def test_a_request_that_overtook_another_gets_invalid_epoch():
    c = cache()
    session_id = open_session(c, [A])
    first = incremental(c, session_id, 1)
    second = incremental(c, session_id, 2)
    late = c.complete_incremental(first, [outcome(A)], 1)
    assert late.error_code == pb.INVALID_FETCH_SESSION_EPOCH and late.listed == []
    assert c.complete_incremental(second, [outcome(A, hw=11)], 1).listed == [0]


def test_a_session_evicted_while_its_fetch_waited_is_not_found():
    c = cache(slots=1, eviction_ms=10)
    session_id = open_session(c, [A], now_ms=0)
    waiting = incremental(c, session_id, 1)
    open_session(c, [B], now_ms=100)  # A's session is stale: evicted
    answer = c.complete_incremental(waiting, [outcome(A)], 100)
    assert answer.error_code == pb.FETCH_SESSION_ID_NOT_FOUND and answer.session_id == 0


def test_full_cache_evicts_a_stale_session_first():
    c = cache(slots=2, eviction_ms=1000)
    old = open_session(c, [A, B, C], now_ms=0)
    young = open_session(c, [A], now_ms=500)
    newest = open_session(c, [A], now_ms=1001)  # old unused for 1001 ms > 1000
    assert c.get(old) is None and c.get(young) is not None and newest != 0
    assert c.counters.evictions == 1 and c.partitions_count == 2


def test_full_cache_refuses_a_new_session_while_none_is_evictable():
    c = cache(slots=2, eviction_ms=1000)
    open_session(c, [A], now_ms=0)
    second = open_session(c, [A], now_ms=10)
    # Used at 900: not stale, and younger than the eviction time when last touched.
    c.complete_incremental(incremental(c, second, 1), [outcome(A)], 900)
    assert open_session(c, [A, B], now_ms=1000) == 0
    assert len(c) == 2 and c.counters.evictions == 0


def test_full_cache_evicts_the_smaller_old_session_for_a_larger_one():
    c = cache(slots=2, eviction_ms=1000)
    small = open_session(c, [A], now_ms=0)
    large = open_session(c, [A, B, C], now_ms=0)
    # Both touched after the eviction time since creation: evictable, and not stale.
    c.complete_incremental(incremental(c, small, 1), [outcome(A)], 1500)
    c.complete_incremental(incremental(c, large, 1), [outcome(k) for k in (A, B, C)], 1500)
    # Keys compare (privileged, size, id), the newcomer's id 0: a 1-partition newcomer
    # is worth less than the 1-partition session, so nothing is evicted for it.
    assert open_session(c, [B], now_ms=1600) == 0
    newcomer = open_session(c, [A, B], now_ms=1600)
    assert newcomer != 0 and c.get(small) is None and c.get(large) is not None


def test_zero_slots_turn_sessions_off():
    c = cache(slots=0)
    assert open_session(c, [A]) == 0 and len(c) == 0


# ---------------------------------------------------------------- properties

@st.composite
def _steps(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    return draw(st.lists(st.tuples(st.sampled_from(["fetch", "produce", "error", "add",
                                                    "forget", "lose", "other"]),
                                   st.integers(0, 5), st.integers(1, 200)),
                         max_size=60))


@settings(max_examples=150, deadline=None)
@given(_steps())
def test_a_client_applying_incremental_answers_always_knows_every_high_watermark(steps):
    """A client as Kafka's FetchSessionHandler: full fetch first, then incremental ones
    naming only changed partitions, starting over on a session error. Whatever happens
    (appends, errors, partitions added and forgotten, other clients filling the cache,
    a lost answer), after each answered fetch it knows every partition's high watermark
    and error, as a full fetch would have told it; and the cache's counts stay true."""
    c = cache(slots=2, eviction_ms=50)
    truth_hw = {("t", p): 0 for p in range(6)}
    truth_error = {k: pb.NONE for k in truth_hw}
    mine: set[PartitionKey] = {("t", 0), ("t", 1)}
    known: dict[PartitionKey, tuple[int, int]] = {}
    session_id, epoch = 0, INITIAL_EPOCH
    pending_add: set[PartitionKey] = set()
    pending_forget: set[PartitionKey] = set()
    now_ms = 0
    for kind, p, amount in steps:
        now_ms += amount
        key = ("t", p)
        if kind == "produce":
            truth_hw[key] += amount
        elif kind == "error":
            truth_error[key] = pb.NONE if truth_error[key] else pb.NOT_LEADER_OR_FOLLOWER
        elif kind == "add" and key not in mine:
            mine.add(key)
            pending_add.add(key)
            pending_forget.discard(key)
        elif kind == "forget" and key in mine and len(mine) > 1:
            mine.discard(key)
            known.pop(key, None)
            pending_forget.add(key)
            pending_add.discard(key)
        elif kind == "other":  # another consumer opens a session (may evict ours)
            open_session(c, [("x", p)], now_ms)
        elif kind == "lose" and session_id:
            epoch = next_epoch(epoch)  # an answer the client never saw
            continue
        # One fetch by the client.
        if epoch == INITIAL_EPOCH:
            wanted, forgotten = wants(*sorted(mine)), []
        else:
            wanted, forgotten = wants(*sorted(pending_add)), sorted(pending_forget)
        try:
            context = c.new_context(session_id, epoch, wanted, forgotten,
                                    uses_topic_ids=False)
        except (FetchSessionIdNotFoundError, InvalidFetchSessionEpochError):
            session_id, epoch = 0, INITIAL_EPOCH  # start over next time
            pending_add.clear()
            pending_forget.clear()
            continue
        outcomes = [PartitionOutcome(k, truth_error[k], truth_hw[k], 0, 0)
                    for k, _ in context.partitions]
        if isinstance(context, FullFetch):
            listed = outcomes
            session_id = c.complete_full(context, outcomes, now_ms)
            epoch = 1 if session_id else INITIAL_EPOCH
            known = {}
        else:
            assert {k for k, _ in context.partitions} == mine
            answer = c.complete_incremental(context, outcomes, now_ms)
            if answer.error_code != pb.NONE:
                session_id, epoch = 0, INITIAL_EPOCH
                pending_add.clear()
                pending_forget.clear()
                continue
            listed = [outcomes[i] for i in answer.listed]
            epoch = next_epoch(epoch)
        pending_add.clear()
        pending_forget.clear()
        for o in listed:
            known[o.key] = (o.high_watermark, o.error_code)
        assert known == {k: (truth_hw[k], truth_error[k]) for k in mine}
        # The cache's own bookkeeping.
        assert len(c) <= 2
        assert c.partitions_count == sum(s.size for s in c.sessions())


def test_a_privileged_session_may_evict_a_young_unprivileged_one():
    c = cache(slots=1, eviction_ms=1000)
    consumer = open_session(c, [A, B], now_ms=0)
    # Young and used: a consumer's newcomer cannot evict it, whatever its size.
    assert open_session(c, [A, B, C], now_ms=10) == 0
    context = c.new_context(0, INITIAL_EPOCH, wants(A), [], uses_topic_ids=False,
                            privileged=True)
    follower = c.complete_full(context, [outcome(A)], 20)  # type: ignore[arg-type]
    assert follower != 0 and c.get(consumer) is None and c.counters.evictions == 1
    # A young privileged session is evictable by nobody but staleness.
    assert open_session(c, [A, B, C], now_ms=30) == 0


def test_the_cache_settings_take_kafkas_names(tmp_path):
    from tidewater.broker.config import BrokerConfig, ConfigError
    config = BrokerConfig(broker_id=1, listen=("127.0.0.1", 0), controller=("127.0.0.1", 1),
                          data_dir=tmp_path)
    config.apply_settings({"max.incremental.fetch.session.cache.slots": "7",
                           "min.incremental.fetch.session.eviction.ms": "50"})
    assert (config.max_incremental_fetch_session_cache_slots,
            config.min_incremental_fetch_session_eviction_ms) == (7, 50)
    with pytest.raises(ConfigError):
        config.apply_settings({"max.incremental.fetch.session.cache.slots": "-1"})


def test_the_metrics_view_counts_sessions_partitions_and_fetch_kinds():
    c = cache()
    session_id = open_session(c, [A, B])
    c.complete_incremental(incremental(c, session_id, 1), [outcome(A), outcome(B)], 1)
    with pytest.raises(InvalidFetchSessionEpochError):
        c.new_context(session_id, 9, {}, [], uses_topic_ids=False)
    view = c.metrics_view()
    assert (view.sessions, view.partitions, view.full, view.incremental, view.errors) == (
        1, 2, 1, 1, 1)
