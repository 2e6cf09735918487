"""Which of a topic's partitions the topic page shows: a page of them at a time.

A topic of 1,000 partitions drawn as one table is half a megabyte of HTML (a row per
partition with each replica's offsets), most of a second to render and seconds for a
browser to lay out; Kafka's consoles show partitions a page at a time for the same
reason. The page asked for is clamped into range, so a link from a time the topic had
more partitions still shows something.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTITIONS_PER_PAGE = 100
MOST_PER_PAGE = 10_000  # "all on one page" for the largest topics a person would scroll


@dataclass(frozen=True, slots=True)
class PartitionPage:
    """Page ``index`` (0-based) of ``total`` partitions, ``per_page`` to a page."""

    index: int
    per_page: int
    total: int

    @staticmethod
    def of(total: int, index: int | None = None, per_page: int = PARTITIONS_PER_PAGE,
           showing: int | None = None) -> PartitionPage:
        """``index`` clamped into range; without one, the page holding position
        ``showing`` (the partition the record browser reads), else the first."""
        per_page = max(1, min(per_page, MOST_PER_PAGE))
        last = max(0, (total - 1) // per_page)
        if index is None:
            index = showing // per_page if showing is not None and showing >= 0 else 0
        return PartitionPage(max(0, min(index, last)), per_page, total)

    @property
    def first(self) -> int:
        return self.index * self.per_page

    @property
    def stop(self) -> int:
        return min(self.total, self.first + self.per_page)

    @property
    def count(self) -> int:
        return (self.total + self.per_page - 1) // self.per_page

    @property
    def has_previous(self) -> bool:
        return self.index > 0

    @property
    def has_next(self) -> bool:
        return self.stop < self.total

    def index_of(self, position: int) -> int:
        """The page that shows the partition at ``position`` (its place in the topic)."""
        return position // self.per_page
