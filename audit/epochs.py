"""Leader-epoch history logic of the audit, pure Python (no Spark), tested directly.

``assign_epoch`` is the epoch cache's ``assign()`` from the protocol reference
(replication.md); replaying it over a log's batches in file order gives the
epoch cache that log implies. ``compare_epoch_checkpoint`` and
``diverging_epochs`` are the decisions of the rules epoch_checkpoint_matches_log
and epoch_histories_agree.
"""

from __future__ import annotations


def assign_epoch(cache: list[tuple[int, int]], epoch: int, start_offset: int) -> None:
    """The leader-epoch cache's assign() (replication.md), on a plain list."""
    if cache and cache[-1][0] == epoch and start_offset >= cache[-1][1]:
        return
    while cache and (cache[-1][0] >= epoch or cache[-1][1] >= start_offset):
        cache.pop()
    cache.append((epoch, start_offset))


def compare_epoch_checkpoint(expected: list[tuple[int, int]], actual: list[tuple[int, int]],
                             log_end_offset: int | None) -> list[tuple[str, int | None]]:
    """Differences between the implied cache and the checkpoint, as (detail, offset)."""
    if actual[: len(expected)] == expected:
        extra = actual[len(expected):]
        last_epoch = expected[-1][0] if expected else -1
        # A leader's (new epoch, LEO) before its first write is the one allowed extra.
        if not extra or (len(extra) == 1 and extra[0][0] > last_epoch
                         and (log_end_offset is None or extra[0][1] == log_end_offset)):
            return []
    problems: list[tuple[str, int | None]] = []
    exp, act = dict(expected), dict(actual)
    for epoch, start in expected:
        if epoch not in act:
            problems.append((f"epoch {epoch} starts at {start} in the log, "
                             "missing from the checkpoint", start))
        elif act[epoch] != start:
            problems.append((f"epoch {epoch}: checkpoint says start {act[epoch]}, "
                             f"log says {start}", start))
    for epoch, start in actual:
        if epoch not in exp:
            problems.append((f"checkpoint has epoch {epoch} at {start}, "
                             "no batch of that epoch starts there in the log", start))
    if not problems:
        problems.append((f"checkpoint entries {actual} in a different order than the log's "
                         f"{expected}", None))
    return problems


def compare_compacted_epoch_checkpoint(expected: list[tuple[int, int]],
                                       actual: list[tuple[int, int]]
                                       ) -> list[tuple[str, int | None]]:
    """The checkpoint of a compacted log against the epochs its batches imply: the
    cleaner removes batches but never changes the checkpoint, so an epoch's entry may
    start before its first batch left (or name an epoch with no batch left), but every
    epoch in the log needs an entry at or before its first batch, in order."""
    problems: list[tuple[str, int | None]] = []
    act = dict(actual)
    if [e for e, _ in actual] != sorted({e for e, _ in actual}) or [
            o for _, o in actual] != sorted(o for _, o in actual):
        problems.append((f"checkpoint entries {actual} are not in increasing order", None))
    for epoch, start in expected:
        if epoch not in act:
            problems.append((f"epoch {epoch} starts at {start} in the log, "
                             "missing from the checkpoint", start))
        elif act[epoch] > start:
            problems.append((f"epoch {epoch}: checkpoint says start {act[epoch]}, "
                             f"a batch of it is at {start} already", start))
    return problems


def diverging_epochs(log_a: dict, log_b: dict) -> list[tuple[int, int, int]]:
    """(epoch, start on a, start on b) for shared epochs whose starts differ.

    A replica's first epoch may start later when its log starts later (retention
    or a follower that began from the leader's log start).
    """
    a, b = dict(log_a["cache"]), dict(log_b["cache"])
    first_a = log_a["cache"][0][0] if log_a["cache"] else None
    first_b = log_b["cache"][0][0] if log_b["cache"] else None
    out = []
    for epoch in sorted(set(a) & set(b)):
        sa, sb = a[epoch], b[epoch]
        if sa == sb:
            continue
        if epoch == first_a and sa > sb and sa == log_a["log_start_offset"]:
            continue
        if epoch == first_b and sb > sa and sb == log_b["log_start_offset"]:
            continue
        out.append((epoch, sa, sb))
    return out
