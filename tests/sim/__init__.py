"""A seeded, deterministic simulation of a Tidewater cluster (3 brokers, RF 3).

Brokers make every replication decision with the production code
(``broker.replication.LeaderPartitionState``, ``follower_truncation``,
``check_diverging``, ``broker.storage.epoch_cache.LeaderEpochCache``) and the
controller with ``controller.election``; only the I/O around them is
simulated: an in-memory network that drops, delays (and so reorders) and
partitions messages, logs whose unflushed tail a crash may lose, an injected
clock. ``checker.InvariantChecker`` checks the invariants of
/work/shared/reference/replication.md after every step.

Run one seed by hand (from the ``tests`` directory)::

    ../.venv/bin/python -m sim.run --seed 7 --verbose
"""
