"""Issue 14, bug 2: the controller never lets state it did not write leave the process.

A failed metadata write (or a command failing after appending) leaves the image
ahead of the log. The owner then poisons the image, the server aborts every
sender and the process exits at once with EXIT_METADATA_NOT_DURABLE: no
LeaderAndIsr, UpdateMetadata or RPC answer built from the unwritten records
reaches anyone. These tests run the real owner, server and senders in-process
(the exit is injected) against fake brokers that record what they receive.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
from dataclasses import replace

import grpc
import pytest
from controller_process import (
    ControllerProcess,
    FakeBroker,
    InProcessController,
    eventually,
)

from tidewater.controller.config import ControllerConfig
from tidewater.controller.metadata import (
    ClusterMetadata,
    ImagePoisonedError,
    partition_changed_record,
)
from tidewater.controller.metadata_log import MetadataLog
from tidewater.controller.owner import ImageAheadOfDiskError, MetadataOwner, OwnerStoppedError
from tidewater.controller.server import EXIT_METADATA_NOT_DURABLE
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import KafkaStorageError


class FullDisk:
    """Stands in for the metadata log's open file: every write fails as on a full disk."""

    def __init__(self, file):
        self._file = file
        self.writes = 0

    def write(self, data):
        self.writes += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._file, name)


# ---------------------------------------------------------------- the log

def test_a_failed_append_makes_the_log_refuse_every_later_append(tmp_path):
    log = MetadataLog.open(tmp_path)
    log.append([{"type": "cluster", "cluster_id": "c"}])
    log._file = FullDisk(log._file)
    with pytest.raises(KafkaStorageError, match="No space left"):
        log.append([{"type": "controller_epoch", "epoch": 1}])
    assert log.failed and log.next_offset == 1
    log._file = log._file._file  # space again: the log still refuses, its file is in doubt
    with pytest.raises(KafkaStorageError, match="failed earlier"):
        log.append([{"type": "controller_epoch", "epoch": 1}])
    with pytest.raises(KafkaStorageError, match="failed earlier"):
        log.rewrite([])
    log.close()
    reopened = MetadataLog.open(tmp_path)
    assert [r for _, r in reopened.recovered_records()] == [{"type": "cluster", "cluster_id": "c"}]
    reopened.close()


def test_compaction_failing_before_the_rename_keeps_the_log_usable(tmp_path, monkeypatch):
    log = MetadataLog.open(tmp_path)
    log.append([{"type": "cluster", "cluster_id": "c"}, {"type": "controller_epoch", "epoch": 1}])
    real_fsync = os.fsync

    def fsync_fails_for_tmp(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync_fails_for_tmp)
    with pytest.raises(KafkaStorageError, match="unchanged"):
        log.rewrite([{"type": "cluster", "cluster_id": "c"}])
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert not log.failed and not (tmp_path / "metadata.log.tmp").exists()
    assert log.append([{"type": "controller_epoch", "epoch": 2}]) == 2
    log.close()
    reopened = MetadataLog.open(tmp_path)
    assert [o for o, _ in reopened.recovered_records()] == [0, 1, 2]
    reopened.close()


def test_compaction_failing_at_the_rename_makes_the_log_refuse_appends(tmp_path, monkeypatch):
    log = MetadataLog.open(tmp_path)
    log.append([{"type": "cluster", "cluster_id": "c"}, {"type": "controller_epoch", "epoch": 1}])
    real_replace = os.replace

    def replace_then_fail(src, dst):
        real_replace(src, dst)  # renamed, then the directory fsync (say) fails
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(os, "replace", replace_then_fail)
    with pytest.raises(KafkaStorageError):
        log.rewrite([{"type": "cluster", "cluster_id": "c"}])
    monkeypatch.setattr(os, "replace", real_replace)
    # The open file is the old, now unlinked inode: an append there would be lost for good.
    assert log.failed
    with pytest.raises(KafkaStorageError, match="failed earlier"):
        log.append([{"type": "controller_epoch", "epoch": 2}])
    log.close()


def test_owner_compaction_failure_before_the_rename_is_not_fatal(tmp_path, monkeypatch):
    log = MetadataLog.open(tmp_path)
    log.append([{"type": "cluster", "cluster_id": "c"}]
               + [{"type": "controller_epoch", "epoch": e} for e in range(1, 10)])
    log.close()
    log = MetadataLog.open(tmp_path)
    fatal = []
    owner = MetadataOwner(log, ControllerStateMachine(ControllerConfig(data_dir=tmp_path)),
                          on_commit=lambda e: None, on_fatal=fatal.append, clock_ms=lambda: 0)
    owner.recover()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", no_space)
    assert owner.maybe_compact(records_min=5) is False  # logged; the log is as it was
    monkeypatch.undo()
    assert not log.failed and log.record_count == 10 and not fatal
    owner.run_now(lambda tx, now: tx.append({"type": "controller_epoch", "epoch": 10}))
    log.close()


# ---------------------------------------------------------------- the image

def test_a_poisoned_image_refuses_every_read():
    metadata = ClusterMetadata()
    metadata.apply(0, {"type": "cluster", "cluster_id": "c"})
    cause = ImageAheadOfDiskError("write failed")
    metadata.poison(cause)
    for read in (lambda: metadata.topics, lambda: metadata.brokers,
                 lambda: metadata.controller_epoch, lambda: metadata.partition("t", 0),
                 lambda: list(metadata.all_partitions()), lambda: metadata.snapshot_records()):
        with pytest.raises(ImagePoisonedError) as raised:
            read()
        assert raised.value.__cause__ is cause
    assert isinstance(metadata, ClusterMetadata) and "Poisoned" in repr(type(metadata))


# ---------------------------------------------------------------- the owner

def make_owner(tmp_path):
    log = MetadataLog.open(tmp_path)
    fatal = []
    owner = MetadataOwner(log, ControllerStateMachine(ControllerConfig(data_dir=tmp_path)),
                          on_commit=lambda effects: None, on_fatal=fatal.append,
                          clock_ms=lambda: 0)
    owner.run_now(lambda tx, now: tx.append({"type": "cluster", "cluster_id": "c"}))
    return owner, log, fatal


@pytest.mark.parametrize("failure", ["write", "command"])
async def test_owner_poisons_the_image_and_calls_the_fatal_hook_before_raising(tmp_path, failure):
    owner, log, fatal = make_owner(tmp_path)
    seen_by_hook = []

    def on_fatal(error):
        # Synchronous, before the caller hears of it: the image is already unreadable.
        with pytest.raises(ImagePoisonedError):
            owner.machine.metadata.cluster_id  # noqa: B018 - the read is the test
        seen_by_hook.append(error)
    owner._on_fatal = on_fatal
    task = asyncio.get_running_loop().create_task(owner.run())

    def command(tx, now_ms):
        tx.append({"type": "controller_epoch", "epoch": 7})
        if failure == "command":
            raise RuntimeError("a bug after appending")
        return "answer built from the unwritten record"
    if failure == "write":
        log._file = FullDisk(log._file)
    with pytest.raises(OwnerStoppedError):
        await owner.submit(command)
    with pytest.raises(ImageAheadOfDiskError):
        await task
    assert len(seen_by_hook) == 1 and isinstance(seen_by_hook[0], ImageAheadOfDiskError)
    assert log.next_offset == 1  # the controller_epoch record is not in the log
    with pytest.raises(OwnerStoppedError):
        await owner.submit(lambda tx, now: None)
    with pytest.raises(OwnerStoppedError):
        owner.run_now(lambda tx, now: None)
    log._file = getattr(log._file, "_file", log._file)
    log.close()


def test_a_record_that_does_not_apply_is_fatal_too(tmp_path):
    """``apply`` may have changed the image before it raised: treated as ahead of the disk."""
    owner, log, fatal = make_owner(tmp_path)
    with pytest.raises(ImageAheadOfDiskError):
        owner.run_now(lambda tx, now: tx.append({"type": "broker_fenced", "broker_id": 9}))
    assert len(fatal) == 1 and log.next_offset == 1
    log.close()


# ---------------------------------------------------------------- the whole server, in-process

def told(broker: FakeBroker) -> set[tuple]:
    """Every partition state ``broker`` was sent, in LeaderAndIsr or UpdateMetadata."""
    states = {(i.state.topic, i.state.partition, i.state.leader, i.state.leader_epoch,
               i.state.partition_epoch, tuple(i.state.isr))
              for r in broker.leader_and_isr for i in r.partitions}
    states |= {(p.topic, p.partition, p.leader, p.leader_epoch, p.partition_epoch, tuple(p.isr))
               for r in broker.update_metadata for p in r.partitions}
    return states


def durable_states(data_dir) -> set[tuple]:
    """Every partition state the metadata log in ``data_dir`` ever held."""
    log = MetadataLog.open(data_dir)
    metadata = ClusterMetadata()
    states = set()
    for offset, record in log.recovered_records():
        metadata.apply(offset, record)
        for p in metadata.all_partitions():
            states.add((p.topic, p.partition, p.leader, p.leader_epoch, p.partition_epoch, p.isr))
    log.close()
    return states


@pytest.mark.parametrize("failure", ["write", "command"])
async def test_nothing_unwritten_reaches_a_broker_and_the_process_exits(tmp_path, failure):
    data_dir = tmp_path / "controller"
    async with InProcessController(data_dir) as controller:
        server = controller.server
        brokers = {b: await FakeBroker(b, controller.address).start(serve=False) for b in (1, 2)}
        try:
            created = await controller.stub.CreateTopics(pb.CreateTopicsRequest(topics=[
                pb.CreatableTopic(name="t", num_partitions=1, replication_factor=2)]), timeout=10)
            assert created.topics[0].error_code == pb.NONE
            p = server.machine.metadata.partition("t", 0)
            leader, follower = p.leader, next(r for r in p.replicas if r != p.leader)
            await brokers[leader].serve()
            await eventually(lambda: brokers[leader].latest_states()[("t", 0)])
            # The follower is unreachable: its sender holds the pending LeaderAndIsr
            # for t-0 (and an UpdateMetadata), retrying every 50 ms.
            sender = server.senders.senders[follower]
            assert not sender.idle

            if failure == "write":
                server.metadata_log._file = FullDisk(server.metadata_log._file)
                brokers[leader].want_shutdown = True  # leadership moves to the follower...
            else:
                def move_leadership_then_fail(tx, now_ms):
                    tx.append(partition_changed_record(replace(
                        p, leader=follower, isr=(follower,), leader_epoch=p.leader_epoch + 1,
                        partition_epoch=p.partition_epoch + 1)))
                    raise RuntimeError("a bug after appending")
                with pytest.raises(OwnerStoppedError):
                    await server.owner.submit(move_leadership_then_fail)
            # ...in a record the log never gets: the process exits at once.
            await eventually(lambda: controller.exits)
            assert controller.exits == [EXIT_METADATA_NOT_DURABLE]
            assert server.failure is not None
            with pytest.raises(ImagePoisonedError):
                server.machine.metadata.topics  # noqa: B018 - the read is the test
            # Every sender task is over: none can build another request.
            done, pending = await asyncio.wait([s._task for s in server.senders.senders.values()],
                                               timeout=5)
            assert not pending

            await brokers[follower].serve()  # reachable now: nothing may arrive
            await asyncio.sleep(0.5)  # ten retry periods of a sender, were one still running
            # Answers are built from the image too: every RPC is refused from now on.
            for call in (controller.stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5),
                         controller.stub.RegisterBroker(pb.RegisterBrokerRequest(
                             broker_id=follower, incarnation_id="after-the-failure",
                             listeners=[pb.Listener(name="INTERNAL", host="127.0.0.1",
                                                    port=1)]), timeout=5)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            for broker in brokers.values():
                await broker.stop()
    durable = durable_states(data_dir)
    for broker_id, broker in brokers.items():
        leaked = told(broker) - durable
        assert not leaked, f"broker {broker_id} was told states the log lacks: {leaked}"
    assert ("t", 0) not in brokers[follower].latest_states()


# ---------------------------------------------------------------- a real process, a full disk

@pytest.fixture
def small_tmpfs(tmp_path):
    """A 512 KiB tmpfs (root only): a disk the test can fill."""
    mount_point = tmp_path / "small-fs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory) -> int:
    """Write zeros into ``directory`` until its filesystem is full; returns the bytes written."""
    written = 0
    with open(directory / "filler", "wb", buffering=0) as out:
        for chunk in (64 * 1024, 4096, 512, 1):
            try:
                while True:
                    written += out.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
        os.fsync(out.fileno())
    return written


@pytest.mark.integration
async def test_full_disk_exits_at_once_and_no_broker_holds_an_epoch_the_log_lacks(
        tmp_path, small_tmpfs):
    settings = ["broker.session.timeout.ms=30000", "auto.leader.rebalance.enable=false"]
    # The data dir is the tmpfs itself: the process's stderr file lands beside it, on tmp_path.
    controller = ControllerProcess(small_tmpfs, settings).start()
    brokers: dict[int, FakeBroker] = {}
    channel = grpc.aio.insecure_channel(controller.address)
    stub = pb_grpc.ControllerStub(channel)
    copy = tmp_path / "writable-copy"
    try:
        for broker_id in (1, 2):
            brokers[broker_id] = await FakeBroker(broker_id, controller.address).start()
        created = await stub.CreateTopics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
            name="t", num_partitions=32, replication_factor=2)], timeout_ms=5000), timeout=10)
        assert created.topics[0].error_code == pb.NONE
        await eventually(lambda: all(len(b.latest_states()) == 32 for b in brokers.values()))

        assert fill(small_tmpfs) > 0
        # Broker 1 shuts down: one command moves 16 leaderships to broker 2 and takes broker
        # 1 out of 32 ISRs, some 5 KiB of records that cannot be written.
        brokers[1].want_shutdown = True
        returncode = await asyncio.to_thread(controller.wait, 15)
        # What the log holds is all any broker was told.
        shutil.copytree(small_tmpfs, copy, ignore=shutil.ignore_patterns("filler"))
        durable = durable_states(copy)
        for broker_id, broker in brokers.items():
            leaked = told(broker) - durable
            assert not leaked, f"broker {broker_id} was told states the log lacks: {leaked}"
        stderr = controller.stderr()
        assert returncode == EXIT_METADATA_NOT_DURABLE, stderr
        assert "CRITICAL" in stderr and f"Exiting at once with code {EXIT_METADATA_NOT_DURABLE}" in stderr

        # A controller restarted on a writable copy hands out only epochs nobody holds:
        # broker 2 shuts down instead, and no (leader epoch, partition epoch) of any
        # partition names two different states across both controllers' lifetimes.
        brokers[1].want_shutdown = False
        restarted = ControllerProcess(copy, settings, port=controller.port).start()
        try:
            brokers[2].want_shutdown = True

            async def broker_1_has_the_restarted_controllers_states():
                described = await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=10,
                                                       wait_for_ready=True)  # reconnecting
                [topic] = described.topics
                states = brokers[1].latest_states()
                return all(p.leader != 2 and (states[("t", p.partition)].leader_epoch,
                                              states[("t", p.partition)].partition_epoch)
                           == (p.leader_epoch, p.partition_epoch) for p in topic.partitions)
            await eventually(broker_1_has_the_restarted_controllers_states, timeout_s=20)
        finally:
            restarted.stop()
        named: dict[tuple, set] = {}
        for broker in brokers.values():
            for topic, partition, leader, leader_epoch, partition_epoch, isr in told(broker):
                named.setdefault((topic, partition, leader_epoch, partition_epoch), set()).add(
                    (leader, isr))
        assert all(len(states) == 1 for states in named.values()), {
            key: states for key, states in named.items() if len(states) > 1}
    finally:
        for broker in brokers.values():
            await broker.stop()
        await channel.close()
        controller.stop()
