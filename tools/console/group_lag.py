"""What the group page shows of a consumer group: one page of its partitions' lag, and,
over all of them, the total, each topic's sum, the largest lags and each member's
assignment in ranges.

A group reading a 1,000-partition topic drawn as one row per partition was 7,050
elements and up to 1.8 s in a loaded browser; the lag table is paged as the topic
page is (``paging.PartitionPage``), and what a person looks for first (how far
behind, where) is summed over the whole group above it. Members are paged the same
way (a group of a thousand consumers is a thousand rows), each with its own page.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from tidewater.client.group_admin import GroupDescription, PartitionLag
from tidewater.tools.console.paging import PARTITIONS_PER_PAGE, PartitionPage

LARGEST_LAG_SHOWN = 10
MEMBERS_PER_PAGE = 100  # a row per member, its assignment in ranges


@dataclass(frozen=True, slots=True)
class TopicLag:
    topic: str
    partitions: int  # the group's partitions of the topic (committed or assigned)
    lag: int | None  # summed over those whose lag is known; None: none is


@dataclass(frozen=True, slots=True)
class LaggingPartition:
    """One of the group's partitions furthest behind, and the page that shows it."""

    topic: str
    partition: int
    lag: int
    page: int


@dataclass(frozen=True, slots=True)
class MemberRow:
    member_id: str
    client_id: str
    client_host: str
    assigned: int  # partitions
    assignment: str  # "topic 0-99, 200; other 3": every topic's partitions in ranges


@dataclass(frozen=True, slots=True)
class GroupPage:
    description: GroupDescription
    total_lag: int | None  # over every partition of the group, not only the shown page
    members_by_id: dict[str, str] = field(default_factory=dict)  # member id -> client id
    shown: PartitionPage = PartitionPage(0, 1, 0)
    partitions: tuple[PartitionLag, ...] = ()  # the shown page's
    topics: tuple[TopicLag, ...] = ()
    largest_lag: tuple[LaggingPartition, ...] = ()  # largest first, none of lag 0
    members: tuple[MemberRow, ...] = ()  # the shown page's
    members_shown: PartitionPage = PartitionPage(0, 1, 0)


def summed_lag(partitions: list[PartitionLag]) -> int | None:
    lags = [p.lag for p in partitions if p.lag is not None]
    return sum(lags) if lags else None


def ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``"0-2, 5, 7-8"``."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def group_page(d: GroupDescription, page: int | None = None,
               per_page: int | None = None, member_page: int | None = None,
               members_per_page: int | None = None) -> GroupPage:
    """``d`` with page ``page`` (0-based) of its partitions, in the order the group
    admin lists them (by topic, then partition), and page ``member_page`` of its
    members, in the coordinator's order."""
    shown = PartitionPage.of(len(d.partitions), page, per_page or PARTITIONS_PER_PAGE)
    members_shown = PartitionPage.of(len(d.members), member_page,
                                     members_per_page or MEMBERS_PER_PAGE)
    by_topic: dict[str, list[PartitionLag]] = {}
    for p in d.partitions:
        by_topic.setdefault(p.topic, []).append(p)
    behind = [(p, i) for i, p in enumerate(d.partitions) if p.lag]
    # nlargest keeps the listed order among equal lags.
    largest = heapq.nlargest(LARGEST_LAG_SHOWN, behind, key=lambda pi: pi[0].lag or 0)
    members = []
    for m in d.members[members_shown.first:members_shown.stop]:
        assigned: dict[str, list[int]] = {}
        for topic, partition in m.partitions:
            assigned.setdefault(topic, []).append(partition)
        members.append(MemberRow(m.member_id, m.client_id, m.client_host, len(m.partitions),
                                 "; ".join(f"{t} {ranges(ps)}" for t, ps in sorted(assigned.items()))))
    return GroupPage(
        d, summed_lag(d.partitions), {m.member_id: m.client_id for m in d.members}, shown,
        tuple(d.partitions[shown.first:shown.stop]),
        tuple(TopicLag(t, len(ps), summed_lag(ps)) for t, ps in sorted(by_topic.items())),
        tuple(LaggingPartition(p.topic, p.partition, p.lag or 0, shown.index_of(i))
              for p, i in largest),
        tuple(members), members_shown)
