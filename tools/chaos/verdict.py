"""Judge a chaos run: what was acknowledged against what is there now (pure).

Per partition:

| column            | meaning                                                      | pass if |
|-------------------|--------------------------------------------------------------|---------|
| acked             | values the cluster acknowledged (acks=all)                   |         |
| lost              | acknowledged, not found anywhere in the topic                | 0       |
| moved             | acknowledged at (partition, offset) but found elsewhere      | 0       |
| dup               | values found more than once (each is sent once)              | 0       |
| order             | records of one producer found before one it sent earlier     | 0       |
| unacked-present   | sent, not acknowledged, yet present (ambiguous attempts: ok) |         |
| unknown           | carry this run's prefix but were never sent                  | 0       |
| compacted         | (``--compacted`` runs) acknowledged, absent, and a later     |         |
|                   | record of its key is there: the cleaner's doing              |         |
| no-leader-s       | seconds without a working leader                             |         |
| replicas          | every replica holds the same batches below the HW            | same    |

Records without this run's prefix (earlier runs, other producers) are ignored.

A compacted topic (``keys`` > 0: producer P's record number S has key
``chaos_key(S, keys)``) keeps at least the last record of each key: an acknowledged
record that is absent counts as compacted, not lost, when a record of its key
remains in its partition at a higher offset; the rest of the columns are as above.

The group (``group_reader.py``, when the run has one): every acknowledged record must
have been consumed by the group, and the committed offsets the coordinator reported
must never go backwards per partition (a lost commit would); the table's last lines
say "every acknowledged record consumed by the group; commits never went backwards"
or what broke it.

The transactional workload (``--transactional``, ``txn_workload.py``): the output topic
read with read_committed holds ``out-<input>`` exactly once per acknowledged input;
``lost`` counts acknowledged inputs without an output, ``duplicated`` the outputs found
beyond the first (both must be 0), ``unknown`` outputs of no input this run sent (0).

The controllers (``controller_failovers``, from the scraped metrics of each
controller): every controller epoch some controller reported while active
(``tidewater_controller_active_controller 1`` with its
``tidewater_controller_controller_epoch``), and who held it; a failover is a new
active epoch after the first. A count, not a pass condition: the other columns say
whether the cluster survived them. Activations shorter than a scrape interval may
be missed, so it is a lower bound.
"""

from __future__ import annotations

import collections
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field

from tidewater.tools.chaos.replicas import ReplicaComparison


@dataclass(slots=True)
class PartitionVerdict:
    partition: int
    acked: int = 0
    lost: int = 0
    moved: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    unacked_present: int = 0
    unknown: int = 0
    compacted: int = 0  # acknowledged, superseded by a later record of its key, cleaned
    no_leader_s: float = 0.0
    replicas_identical: bool = True
    replicas_detail: str = ""
    examples: list[str] = field(default_factory=list)  # a few lost/moved/dup values

    @property
    def ok(self) -> bool:
        return (not (self.lost or self.moved or self.duplicates or self.out_of_order or self.unknown)
                and self.replicas_identical)


@dataclass(slots=True)
class GroupVerdict:
    group_id: str
    not_consumed: int = 0  # acknowledged records the group never consumed
    backwards: list[str] = field(default_factory=list)  # "partition p: 12 -> 9"
    commits_seen: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.not_consumed and not self.backwards

    def line(self) -> str:
        if self.ok:
            return (f"group {self.group_id}: every acknowledged record consumed by the group; "
                    f"commits never went backwards ({self.commits_seen} commits seen)")
        problems = []
        if self.not_consumed:
            problems.append(f"{self.not_consumed} acknowledged records never consumed "
                            f"({', '.join(self.examples)})")
        if self.backwards:
            problems.append(f"commits went backwards: {', '.join(self.backwards[:EXAMPLES_MAX])}")
        return f"group {self.group_id}: " + "; ".join(problems)


@dataclass(slots=True)
class TxnVerdict:
    inputs_acked: int = 0
    outputs: int = 0  # values in the read_committed output carrying this run's prefix
    lost: int = 0  # acknowledged inputs without an output
    duplicated: int = 0  # outputs beyond their input's copies in the input topic
    unknown: int = 0  # outputs of no input this run sent
    # Copies beyond the first of inputs the feeder sent once (its client re-sent them:
    # not the app's doing, so not duplicates of the output).
    inputs_written_twice: int = 0
    transactions_committed: int = 0
    transactions_aborted: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unknown)

    def line(self) -> str:
        line = (f"transactional: {self.inputs_acked} inputs acked, {self.outputs} outputs "
                f"read_committed, lost {self.lost}, duplicated {self.duplicated}, "
                f"unknown {self.unknown} ({self.transactions_committed} transactions "
                f"committed, {self.transactions_aborted} aborted)")
        if self.inputs_written_twice:
            line += (f"; the input topic holds {self.inputs_written_twice} extra copies of "
                     f"inputs sent once (the feeder's client re-sent them), each processed")
        if self.examples:
            line += f"; examples: {', '.join(self.examples)}"
        return line


def judge_transactional(*, input_prefix: str, output_prefix: str, sent: AbstractSet[str],
                        acked: AbstractSet[str], outputs: list[str],
                        inputs: list[str] | None = None,
                        transactions_committed: int = 0,
                        transactions_aborted: int = 0) -> TxnVerdict:
    """``outputs``: every value of the output topic read with read_committed; ``inputs``:
    every value of the input topic (None: not read, each input counts once). Exactly
    once is per input record: an input the feeder's client wrote twice has two outputs."""
    v = TxnVerdict(inputs_acked=len(acked), transactions_committed=transactions_committed,
                   transactions_aborted=transactions_aborted)
    copies: collections.Counter[str] = collections.Counter(
        value for value in inputs or () if value.startswith(input_prefix))
    v.inputs_written_twice = sum(n - 1 for n in copies.values() if n > 1)
    found: collections.Counter[str] = collections.Counter()
    for value in outputs:
        source = value[len(output_prefix):] if value.startswith(output_prefix) else None
        if source is None or not source.startswith(input_prefix):
            continue  # another run's or another writer's record
        v.outputs += 1
        found[source] += 1
        if source not in sent:
            v.unknown += 1
            if len(v.examples) < EXAMPLES_MAX:
                v.examples.append(f"unknown {value}")
    for source, count in sorted(found.items()):
        expected = max(1, copies[source])
        if count > expected:
            v.duplicated += count - expected
            if len(v.examples) < EXAMPLES_MAX:
                v.examples.append(f"dup {source} x{count}"
                                  + (f" (x{expected} in the input)" if expected > 1 else ""))
    for source in sorted(acked):
        if source not in found:
            v.lost += 1
            if len(v.examples) < EXAMPLES_MAX:
                v.examples.append(f"lost {source}")
    return v


ACTIVE_METRIC = "tidewater_controller_active_controller"
EPOCH_METRIC = "tidewater_controller_controller_epoch"


@dataclass(slots=True)
class ControllerVerdict:
    """The controllers' failovers during a run (a count: the data columns judge)."""

    controllers: list[str]
    active_epochs: list[tuple[int, str]]  # (controller epoch, who was active), in order

    @property
    def failovers(self) -> int:
        return max(0, len(self.active_epochs) - 1)

    def line(self) -> str:
        held = ", ".join(f"{epoch} {node}" for epoch, node in self.active_epochs) or "none seen"
        return (f"controllers {', '.join(self.controllers)}: {self.failovers} controller "
                f"failover(s) (active epochs: {held})")


def _gauge(text: str, name: str) -> float | None:
    """An unlabelled sample's value in a Prometheus exposition (None if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def controller_failovers(samples: dict[str, list[tuple[int, str]]]) -> ControllerVerdict:
    """``samples``: controller -> [(unix_ms, exposition text)] of its good scrapes."""
    first_seen: dict[int, tuple[int, str]] = {}  # epoch -> (first unix_ms active, node)
    for node, scrapes in samples.items():
        for unix_ms, text in scrapes:
            if _gauge(text, ACTIVE_METRIC) != 1:
                continue
            epoch = _gauge(text, EPOCH_METRIC)
            if epoch is None:
                continue
            seen = first_seen.get(int(epoch))
            if seen is None or unix_ms < seen[0]:
                first_seen[int(epoch)] = (unix_ms, node)
    return ControllerVerdict(sorted(samples),
                             [(epoch, node) for epoch, (_, node) in sorted(first_seen.items())])


@dataclass(slots=True)
class Verdict:
    partitions: list[PartitionVerdict]
    sent: int
    failed_attempts: int
    notes: list[str] = field(default_factory=list)  # run-level problems (ISR never full, ...)
    group: GroupVerdict | None = None
    compacted: bool = False  # a compacted topic's run: the compacted column is shown
    transactional: TxnVerdict | None = None  # a --transactional run's counts
    controllers: ControllerVerdict | None = None  # failovers seen in the metrics

    @property
    def ok(self) -> bool:
        return (all(p.ok for p in self.partitions) and not self.notes
                and (self.group is None or self.group.ok)
                and (self.transactional is None or self.transactional.ok))

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "sent": self.sent, "failed_attempts": self.failed_attempts,
                "compacted": self.compacted,
                "notes": list(self.notes), "partitions": [asdict(p) for p in self.partitions],
                "group": asdict(self.group) if self.group is not None else None,
                "transactional": (asdict(self.transactional)
                                  if self.transactional is not None else None),
                "controllers": (None if self.controllers is None else {
                    "names": self.controllers.controllers,
                    "failovers": self.controllers.failovers,
                    "active_epochs": [{"epoch": e, "node": n}
                                      for e, n in self.controllers.active_epochs]})}

    def table(self) -> str:
        counts = ["acked", "lost", "moved", "duplicates", "out_of_order", "unacked_present",
                  "unknown"] + (["compacted"] if self.compacted else [])
        header = ("partition", "acked", "lost", "moved", "dup", "order", "unacked-present",
                  "unknown", *(["compacted"] if self.compacted else []), "no-leader-s", "replicas")
        rows = [header]
        for p in self.partitions:
            rows.append((str(p.partition), *(str(getattr(p, name)) for name in counts),
                         f"{p.no_leader_s:.1f}", "identical" if p.replicas_identical else "DIVERGED"))

        def total(name: str) -> str:
            return str(sum(getattr(p, name) for p in self.partitions))
        rows.append(("total", *(total(name) for name in counts),
                     f"{sum(p.no_leader_s for p in self.partitions):.1f}",
                     "identical" if all(p.replicas_identical for p in self.partitions) else "DIVERGED"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                 for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
        out = "\n".join(lines)
        out += f"\nsent {self.sent} values, {self.failed_attempts} attempts failed (not acknowledged)"
        for p in self.partitions:
            if not p.replicas_identical:
                out += f"\npartition {p.partition} replicas: {p.replicas_detail}"
            if p.examples:
                out += f"\npartition {p.partition} examples: {', '.join(p.examples)}"
        if self.group is not None:
            out += "\n" + self.group.line()
        if self.transactional is not None:
            out += "\n" + self.transactional.line()
        if self.controllers is not None:
            out += "\n" + self.controllers.line()
        for note in self.notes:
            out += f"\nproblem: {note}"
        out += "\nVERDICT: " + ("PASS" if self.ok else "FAIL")
        return out


EXAMPLES_MAX = 5


def _producer_and_seq(value: str, value_prefix: str) -> tuple[str | None, int]:
    """``<prefix><producer>-<seq>`` -> (producer, seq); (None, -1) for another shape."""
    if not value.startswith(value_prefix):
        return None, -1
    producer, _, seq = value[len(value_prefix):].rpartition("-")
    if not producer or not seq.isdigit():
        return None, -1
    return producer, int(seq)


def chaos_key(seq: int, keys: int) -> str:
    """The key of a producer's record number ``seq`` in a run with ``keys`` keys."""
    return f"k{seq % keys}"


def judge(*, partitions: list[int], value_prefix: str, sent: dict[str, int],
          acked: dict[str, tuple[int, int]], consumed: dict[int, list[tuple[int, str]]],
          no_leader_s: dict[int, float], replicas: dict[int, ReplicaComparison],
          failed_attempts: int = 0, notes: list[str] | None = None, keys: int = 0) -> Verdict:
    """``consumed``: partition -> [(offset, value)] read back from the start to the HW;
    ``keys`` > 0: a compacted topic's run (module docstring)."""
    where: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
    for partition, records in consumed.items():
        for offset, value in records:
            if value.startswith(value_prefix):
                where[value].append((partition, offset))
    key_end = _key_ends(consumed, value_prefix, keys) if keys else {}
    verdicts = {p: PartitionVerdict(p, no_leader_s=no_leader_s.get(p, 0.0)) for p in partitions}

    def example(v: PartitionVerdict, text: str) -> None:
        if len(v.examples) < EXAMPLES_MAX:
            v.examples.append(text)

    for value, (partition, offset) in acked.items():
        v = verdicts[partition]
        v.acked += 1
        found = where.get(value, [])
        if not found and keys and _superseded(value, value_prefix, keys, partition, offset,
                                              key_end):
            v.compacted += 1
        elif not found:
            v.lost += 1
            example(v, f"lost {value}@{offset}")
        elif (partition, offset) not in found:
            v.moved += 1
            example(v, f"moved {value}@{partition}/{offset} -> {found}")
    for value, places in where.items():
        partition = places[0][0]
        v = verdicts.setdefault(partition, PartitionVerdict(partition))
        if value not in sent:
            v.unknown += 1
            example(v, f"unknown {value}")
            continue
        if len(places) > 1:
            v.duplicates += len(places) - 1
            example(v, f"dup {value} at {places}")
        if value not in acked:
            v.unacked_present += 1
    for partition, records in consumed.items():
        v = verdicts.setdefault(partition, PartitionVerdict(partition))
        last_seq: dict[str, int] = {}  # producer -> the sequence of its last record read
        for offset, value in sorted(records):
            producer, seq = _producer_and_seq(value, value_prefix)
            if producer is None or value not in sent:
                continue
            if seq <= last_seq.get(producer, -1):
                v.out_of_order += 1
                example(v, f"order {value}@{offset} after seq {last_seq[producer]}")
            last_seq[producer] = max(seq, last_seq.get(producer, -1))
    for p, comparison in replicas.items():
        v = verdicts.setdefault(p, PartitionVerdict(p))
        v.replicas_identical = comparison.identical
        v.replicas_detail = comparison.detail
    return Verdict(sorted(verdicts.values(), key=lambda v: v.partition), sent=len(sent),
                   failed_attempts=failed_attempts, notes=list(notes or []), compacted=keys > 0)


def _key_ends(consumed: dict[int, list[tuple[int, str]]], value_prefix: str, keys: int
              ) -> dict[tuple[int, str], int]:
    """(partition, key) -> the highest offset a record of that key is found at."""
    key_end: dict[tuple[int, str], int] = {}
    for partition, records in consumed.items():
        for offset, value in records:
            _producer, seq = _producer_and_seq(value, value_prefix)
            if seq >= 0:
                place = (partition, chaos_key(seq, keys))
                key_end[place] = max(offset, key_end.get(place, -1))
    return key_end


def compacted_away(acked: dict[str, tuple[int, int]], consumed: dict[int, list[tuple[int, str]]],
                   value_prefix: str, keys: int) -> set[tuple[int, int]]:
    """(partition, offset) of the acknowledged records a later record of their key
    replaced in the topic (what ``judge`` counts as compacted)."""
    key_end = _key_ends(consumed, value_prefix, keys)
    present = {(p, o) for p, records in consumed.items() for o, _ in records}
    return {place for value, place in acked.items()
            if place not in present
            and _superseded(value, value_prefix, keys, place[0], place[1], key_end)}


def _superseded(value: str, value_prefix: str, keys: int, partition: int, offset: int,
                key_end: dict[tuple[int, str], int]) -> bool:
    """A record of ``value``'s key remains in its partition above ``offset``."""
    _producer, seq = _producer_and_seq(value, value_prefix)
    return seq >= 0 and key_end.get((partition, chaos_key(seq, keys)), -1) > offset


def judge_group(group_id: str, acked: dict[str, tuple[int, int]],
                consumed: set[tuple[int, int]], committed: dict[int, list[int]],
                excused: AbstractSet[tuple[int, int]] = frozenset()) -> GroupVerdict:
    """``acked``: value -> (partition, offset); ``consumed``: (partition, offset) the group
    read; ``committed``: partition -> committed offsets as reported, in time order;
    ``excused``: records the cleaner may have removed before the group read them
    (``compacted_away``)."""
    v = GroupVerdict(group_id, commits_seen=sum(len(c) for c in committed.values()))
    for value, place in sorted(acked.items(), key=lambda item: item[1]):
        if place not in consumed and place not in excused:
            v.not_consumed += 1
            if len(v.examples) < EXAMPLES_MAX:
                v.examples.append(f"{value}@{place[0]}/{place[1]}")
    for partition, offsets in sorted(committed.items()):
        for before, after in zip(offsets, offsets[1:], strict=False):
            if after < before:
                v.backwards.append(f"partition {partition}: {before} -> {after}")
    return v
