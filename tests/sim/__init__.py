"""A seeded, deterministic simulation of a Tidewater cluster (3 brokers, RF 3, one controller).

It runs the product's decision code, and fakes only the network, the disks
and the clock:

* brokers (``sim_broker``): ``broker.replication.ReplicaState``, the broker's
  replication core (becoming leader or follower, fencing, HW, ISR proposals,
  truncation, acks=all), and ``broker.topic_identity`` (which topic
  incarnation a log belongs to, stray replicas, StopReplica by topic ID); the
  module itself is the shell around them, as ``broker/replicas/control.py``,
  ``broker/controller_link/channel.py`` and the fetcher are around the real ones;
* the controller (``sim_controller``): ``controller.state_machine`` driven
  through ``controller.owner.MetadataOwner`` over a fake metadata log
  (``sim_metadata_log``, the product's framing and recovery in memory, whose
  writes can fail as a full disk does) and the senders' core
  ``controller.send_marks`` (marks, request order, put-back, backoff); the module
  is the transport: ``controller/service.py``'s calls and heartbeat streams,
  ``controller/sender.py``'s calls (one in flight, a request timeout),
  ``controller/server.py``'s timers and process lifecycle (crash and restart,
  exit at once on a failed write);
* fakes: an in-memory network that drops, delays (and so reorders) and
  partitions messages (``network``), broker logs whose unflushed tail a crash
  may lose (``sim_log``), an injected clock and seeded IDs.

``checker.InvariantChecker`` checks the invariants of
/work/shared/reference/replication.md after every step, plus one leader per
(topic incarnation, partition, leader epoch) and no replica holding another
incarnation's records. ``cluster.Simulation`` is the loop, the faults and the
clients (producers, and an admin client that deletes and re-creates the topic).

Run one seed by hand (from the ``tests`` directory)::

    ../.venv/bin/python -m sim.run --seed 7 --verbose

The controller quorum has its own simulation (``raft_cluster``, swept by
``raft_run``, tested by ``test_raft_simulation``): 3 or 5 ``controller.raft``
nodes on a network that also duplicates messages, disks whose writes fail or
are wiped, snapshots and voter changes; ``../.venv/bin/python -m sim.raft_run
--seed 7 --verbose``.
"""
