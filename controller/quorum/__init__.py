"""The controller quorum between processes: the Raft core (``controller/raft/``) in a shell.

Modules: ``config`` (``controller.quorum.voters``, ``node.id``, observers),
``codec`` (the core's messages as bytes), ``transport`` (peer senders, inbound
checks), ``shell`` (the asyncio driver: one RaftNode, its files, the order in
which a Ready is carried out), ``service`` (the ControllerQuorum gRPC service),
``record_log`` (the stand-alone node's application: committed records),
``metrics`` (Kafka's raft-metrics on the controller's /metrics),
``metadata_app`` (the controller's metadata as the application), ``owner``
(QuorumOwner: the metadata owner over this shell),
``formatting`` (kafka-storage format: a directory is formatted once, with a random
directory id; a controller refuses an unformatted one), ``migration`` (a single
controller's metadata.log as every controller's first snapshot, once),
``__main__`` (``format``, ``run``, ``propose``, ``read``, ``describe``).

The metadata owner onto Raft
============================

Without ``controller.quorum.voters`` the controller keeps ``controller/owner.py``
(MetadataOwner) and its JSON log (``metadata_log.py``), unchanged. With it, steps
1-4 below are done (``metadata_app``, ``owner``, ``controller/server.py``'s
``_start_quorum``, ``broker/controller_link/channel.py``), and 5 (``migration``); 6 is not all
done. The plan as written:

1. The application: replace ``record_log.CommittedRecords`` by the metadata
   state machine. A committed DATA entry's bytes are one metadata record (the
   records ``metadata_log.py`` writes today); ``apply`` is
   ``state_machine.replay``; the snapshot image is the state machine's image
   (``compact`` after ``snapshot_interval_entries``), restored on start and on
   ``snapshot_install``.
2. The owner proposes through Raft: a command's records go to
   ``QuorumShell.propose`` on the leader, and its answer resolves only once they
   are committed *and* applied (the waiter in ``shell._wait_committed``), never
   at append. The owner applies only committed entries, the same code at
   start-up (replay from snapshot + log) and at run time. On losing leadership
   (the node's role leaves LEADER) pending commands fail with NOT_CONTROLLER
   and the owner stops issuing decisions (LeaderAndIsr, UpdateMetadata); the
   new leader's first committed entry of its epoch (LEADER_CHANGE) is where it
   may start deciding, after replaying everything before it.
3. Standbys: every non-leader controller applies the committed entries into a
   hot image, so a failover needs no replay; the controller epoch becomes the
   Raft epoch (fencing brokers' stale controllers).
4. Brokers take a list of controllers (``controller.quorum.bootstrap.servers``),
   send to any, and follow NOT_CONTROLLER answers' leader hint
   (``QuorumProposeResponse.leader_id``; the broker side is
   ``broker/controller_link``, its rules in ``controller_choice.py``, which the
   cluster simulation's brokers run against three simulated quorum controllers:
   ``tests/sim/sim_quorum.py``). The controller's Controller service answers
   NOT_CONTROLLER on standbys, as admin_forwarding does on brokers.
5. Done: the JSON metadata log is migrated once. ``tide quorum format
   --migrate-metadata-log`` (and ``tide cluster up`` in a one-controller folder)
   builds every controller's first snapshot from it, ending at its next offset in
   epoch 1, and renames it; a quorum controller refuses a data dir whose
   metadata.log was never migrated.
6. Done since: mTLS between controllers (``config.tls``; ``transport`` and
   ``service`` admit only controller certificates to the Raft RPCs) and Kafka's
   raft-metrics (``metrics``). Not done yet in this shell: fsyncs run on the event
   loop (a thread would keep it responsive under slow disks); Kafka's
   request/response RPCs per message kind (here one one-way RPC carries every
   message and answers come back the same way); bootstrap servers instead of a
   static voters list for addresses.
"""
