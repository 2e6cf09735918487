"""The seeded fault plan: which fault, on what, when, for how long (pure).

One seed gives one plan. Faults run one after another (never two at once), so
with replication factor 3 and min.insync.replicas 2 the cluster should stay
writable except during elections; a plan is a list of ``PlannedFault``:

| kind              | target                 | applied as         | undone as |
|-------------------|------------------------|--------------------|-----------|
| ``kill_leader``   | a partition number     | kill its leader    | start     |
| ``kill_broker``   | a broker id            | kill               | start     |
| ``kill_controller``| ``controller``, or    | kill               | start     |
|                   | ``active``/``standby`` |                    |           |
| ``pause_controller``| ``active``/``standby``| pause             | unpause   |
| ``isolate_controller``| ``active``/``standby``| cut off network | heal      |
| ``pause_broker``  | a broker id            | pause (a long GC)  | unpause   |
| ``isolate_broker``| a broker id            | cut off network    | heal      |

The leader of a ``kill_leader`` fault is looked up when the fault is applied, and
so is the controller of an ``active``/``standby`` target (the active one, or
one of the others, picked by the seed); everything else is fixed by the seed.
Times are seconds from the run's start.

With one controller (``controllers=1``) a plan is what it always was: the
controller kinds are ``kill_controller`` of ``controller`` only. With a quorum
the pause and isolate kinds join, and each controller fault targets the active
controller or a standby (half each): the quorum must elect a new active
controller, or carry on without a follower, while brokers fail too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULT_WEIGHTS = {
    "kill_leader": 3,
    "kill_broker": 2,
    "kill_controller": 1,
    "pause_broker": 2,
    "isolate_broker": 2,
}
# Added to the weights when the cluster runs a quorum of controllers.
QUORUM_FAULT_WEIGHTS = {
    "kill_controller": 2,
    "pause_controller": 1,
    "isolate_controller": 1,
}
CONTROLLER_FAULTS = frozenset({"kill_controller", "pause_controller", "isolate_controller"})
CONTROLLER_TARGETS = ("active", "standby")
UNDO_ACTION = {
    "kill_leader": "start",
    "kill_broker": "start",
    "kill_controller": "start",
    "pause_controller": "unpause",
    "isolate_controller": "heal",
    "pause_broker": "unpause",
    "isolate_broker": "heal",
}
APPLY_ACTION = {
    "kill_leader": "kill",
    "kill_broker": "kill",
    "kill_controller": "kill",
    "pause_controller": "pause",
    "isolate_controller": "isolate",
    "pause_broker": "pause",
    "isolate_broker": "isolate",
}


@dataclass(frozen=True, slots=True)
class PlannedFault:
    start_s: float
    kind: str
    target: int | str  # partition (kill_leader), broker id, "controller", "active", "standby"
    hold_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.hold_s

    def to_json(self) -> dict[str, object]:
        return {"start_s": round(self.start_s, 3), "kind": self.kind, "target": self.target,
                "hold_s": round(self.hold_s, 3)}


def plan_faults(seed: int, duration_s: float, broker_ids: list[int], partitions: int, *,
                warmup_s: float = 5.0, cooldown_s: float = 5.0,
                hold_s: tuple[float, float] = (2.0, 8.0), gap_s: tuple[float, float] = (1.0, 4.0),
                weights: dict[str, int] | None = None, controllers: int = 1) -> list[PlannedFault]:
    """A fault sequence that starts after ``warmup_s`` and has undone every fault
    ``cooldown_s`` before ``duration_s``. Empty when there is no room for one.
    ``controllers``: how many the cluster runs (above 1: the quorum's faults)."""
    if not broker_ids:
        raise ValueError("no brokers to inject faults into")
    if partitions < 1:
        raise ValueError("the topic needs at least one partition")
    quorum = controllers > 1
    if weights is None:
        weights = {**FAULT_WEIGHTS, **QUORUM_FAULT_WEIGHTS} if quorum else dict(FAULT_WEIGHTS)
    weights = dict(weights)
    unknown = set(weights) - set(FAULT_WEIGHTS) - set(QUORUM_FAULT_WEIGHTS)
    if unknown:
        raise ValueError(f"unknown fault kind(s): {', '.join(sorted(unknown))}")
    kinds = [k for k, w in weights.items() if w > 0]
    if not kinds:
        raise ValueError("every fault kind has weight 0")
    rng = random.Random(seed)
    end_by = duration_s - cooldown_s
    plan: list[PlannedFault] = []
    t = warmup_s
    while True:
        kind = rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
        hold = rng.uniform(*hold_s)
        if t + hold > end_by:
            break
        if kind == "kill_leader":
            target: int | str = rng.randrange(partitions)
        elif kind in CONTROLLER_FAULTS:
            target = rng.choice(CONTROLLER_TARGETS) if quorum else "controller"
        else:
            target = rng.choice(sorted(broker_ids))
        plan.append(PlannedFault(t, kind, target, hold))
        t += hold + rng.uniform(*gap_s)
    return plan
