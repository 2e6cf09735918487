"""The group and transaction coordinators behind one accessor, built on first use.

Why: their modules (``broker/group``, ``broker/txn``, the Kafka and gRPC APIs over them)
are about a sixth of what a broker imports, and nothing a broker does before it serves
needs them (issue 30: "imports that a broker does not need at start-up wait"). The
broker process asks for them once it serves (unfenced, named in the controller's
metadata), so their leadership scans and timers run as before, just later; a request that needs them
earlier (a group or transaction API, a transactional produce's verification, a marker
on ``__consumer_offsets``) builds them itself. Building is synchronous (imports,
constructors, ``start``) on the event loop's one thread: no caller ever sees one
coordinator without the other, or one not yet started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidewater.broker.group.coordinator import GroupCoordinator
    from tidewater.broker.txn.coordinator import TransactionCoordinator

# What ``build`` returns: both coordinators, started.
Built = tuple["GroupCoordinator", "TransactionCoordinator"]


class Coordinators:
    """The broker's group and transaction coordinators; ``build`` runs once, at the
    first ``group``/``txn``/``ensure_built``."""

    def __init__(self, build: Callable[[], Built]) -> None:
        self._build = build
        self._built: Built | None = None

    @classmethod
    def of(cls, group: GroupCoordinator, txn: TransactionCoordinator) -> Coordinators:
        """Coordinators already built (tests, tools that build their own)."""
        made = cls(lambda: (group, txn))
        made.ensure_built()
        return made

    @property
    def built(self) -> Built | None:
        """Both coordinators if built already, else None (shutdown: nothing to stop)."""
        return self._built

    def ensure_built(self) -> Built:
        if self._built is None:
            self._built = self._build()
        return self._built

    @property
    def group(self) -> GroupCoordinator:
        return self.ensure_built()[0]

    @property
    def txn(self) -> TransactionCoordinator:
        return self.ensure_built()[1]
