"""The on-disk log: epoch cache, checkpoints, indexes, segments, ``Log``, ``LogManager``.

The folder mirrors the files in one partition directory (``<topic>-<partition>/``):
``*.log`` segments, ``*.index`` / ``*.timeindex`` indexes, ``leader-epoch-checkpoint``;
and in the data dir: ``replication-offset-checkpoint``,
``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint`` and the
clean-shutdown marker.
"""
