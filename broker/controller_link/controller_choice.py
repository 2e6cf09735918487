"""Which of a quorum's controllers a broker's calls go to (pure).

The rules ``ControllerChannel`` follows with several controllers (``--controller``
with a list, Kafka's ``controller.quorum.bootstrap.servers``), and the simulation's
broker too:

* a call answered UNAVAILABLE or not at all (a standby's NOT_CONTROLLER, a dead,
  stopping or cut-off controller) moves to the leader a standby named, when it is
  one of the list's node ids and not the current one, else to the next in the list;
* a request of a newer controller epoch from a listed node id (the new active
  controller's resync) moves to that node.

With one controller nothing moves. A node id of -1 is a controller given without
``ID@`` (its id unknown): it is only reached by going round the list.
"""

from __future__ import annotations

from collections.abc import Sequence


class ControllerChoice:
    def __init__(self, node_ids: Sequence[int]):
        if not node_ids:
            raise ValueError("at least one controller is needed")
        self.node_ids = tuple(node_ids)
        self.current = 0  # index into node_ids

    @property
    def current_id(self) -> int:
        return self.node_ids[self.current]

    def _index_of(self, node_id: int) -> int:
        """The list index of a named controller, -1 if it is not listed."""
        if node_id < 0:
            return -1
        for i, known in enumerate(self.node_ids):
            if known == node_id:
                return i
        return -1

    def on_unavailable(self, leader_hint: int = -1) -> bool:
        """The current controller did not take a call; ``leader_hint``: the leader a
        standby named (-1: none). True if the current controller moved."""
        if len(self.node_ids) == 1:
            return False
        named = self._index_of(leader_hint)
        self.current = (named if named >= 0 and named != self.current
                        else (self.current + 1) % len(self.node_ids))
        return True

    def follow_active(self, controller_id: int) -> bool:
        """A request of a newer controller epoch came from ``controller_id``: move there.
        True if the current controller moved."""
        named = self._index_of(controller_id)
        if len(self.node_ids) == 1 or named < 0 or named == self.current:
            return False
        self.current = named
        return True
