"""Issue 26 steps 1-3: the metadata owner over the Raft quorum (``controller.quorum.voters``).

Real controller processes: one becomes active, the standbys answer NOT_CONTROLLER with
the leader's id, a registration made on the active controller is known to the next one
after a SIGKILL (the standby's image was hot), and the controller epoch is the Raft epoch.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from controller_process import ControllerProcess, free_port

from tidewater.controller.config import ControllerConfig
from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.quorum.metadata_app import MetadataApplication, encode_record
from tidewater.controller.quorum.owner import LEADER_HINT_KEY
from tidewater.controller.raft import Entry, EntryKind
from tidewater.controller.state_machine import ControllerStateMachine
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto import tidewater_pb2_grpc as pb_grpc
from tidewater.proto.errors import InvariantViolation
from tidewater.tools.local_cluster import format_new_quorum

pytestmark = pytest.mark.timeout(120)

LISTENERS = [pb.Listener(name="INTERNAL", host="127.0.0.1", port=1)]


def start_quorum(tmp_path: Path, count: int = 3, session_timeout_ms: int = 30000,
                 ) -> tuple[list[ControllerProcess], str]:
    voters = ",".join(f"{i + 1}@127.0.0.1:{free_port()}" for i in range(count))
    # Formatted first, as every quorum is (kafka-storage format): random directory ids.
    format_new_quorum({i + 1: tmp_path / f"c{i + 1}" / "data" for i in range(count)})
    procs = []
    for i in range(count):
        procs.append(ControllerProcess(tmp_path / f"c{i + 1}" / "data", settings=[
            f"node.id={i + 1}", f"controller.quorum.voters={voters}",
            f"broker.session.timeout.ms={session_timeout_ms}",
            "auto.leader.rebalance.enable=false",
            "controller.quorum.election.timeout.ms=500"]))
    try:
        for proc in procs:
            proc.start()
    except BaseException:
        # One that did not start (a loaded host): the started ones are stopped, not leaked.
        for proc in procs:
            proc.stop()
        raise
    return procs, voters


def register(address: str, broker_id: int, incarnation: str
             ) -> pb.RegisterBrokerResponse | grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        try:
            return pb_grpc.ControllerStub(channel).RegisterBroker(pb.RegisterBrokerRequest(
                broker_id=broker_id, incarnation_id=incarnation, listeners=LISTENERS), timeout=5)
        except grpc.RpcError as e:
            return e


def find_active(procs: list[ControllerProcess], broker_id: int, incarnation: str,
                timeout_s: float = 30) -> tuple[ControllerProcess, pb.RegisterBrokerResponse,
                                                dict[str, str]]:
    """The controller that takes a registration, and a standby's NOT_CONTROLLER answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        refusals: dict[str, str] = {}
        for proc in procs:
            if proc.proc is None or proc.proc.poll() is not None:
                continue
            answer = register(proc.address, broker_id, incarnation)
            if isinstance(answer, pb.RegisterBrokerResponse) and answer.error_code == pb.NONE:
                return proc, answer, refusals
            if isinstance(answer, grpc.RpcError):
                assert answer.code() == grpc.StatusCode.UNAVAILABLE, answer
                assert "NOT_CONTROLLER" in answer.details(), answer.details()
                refusals[proc.address] = dict(answer.trailing_metadata() or ())[LEADER_HINT_KEY]
        time.sleep(0.2)
    pytest.fail("no controller became active")


def heartbeat(address: str, broker_id: int, broker_epoch: int,
              token: bytes) -> pb.BrokerHeartbeatResponse:
    with grpc.insecure_channel(address) as channel:
        [answer] = list(pb_grpc.ControllerStub(channel).BrokerHeartbeats(iter([
            pb.BrokerHeartbeatRequest(broker_id=broker_id, broker_epoch=broker_epoch,
                                      control_token=token)]), timeout=5))
        return answer


def test_standbys_refuse_and_a_new_leader_knows_the_old_leaders_registrations(tmp_path):
    procs, voters = start_quorum(tmp_path)
    try:
        active, registered, _ = find_active(procs, 1, "a" * 32)
        node_ids = {p.address: i + 1 for i, p in enumerate(procs)}
        # Every standby names the active controller (its hint may lag: retry until it does).
        deadline = time.monotonic() + 10
        while True:
            hints = {}
            for proc in procs:
                if proc is active:
                    continue
                answer = register(proc.address, 1, "a" * 32)
                assert isinstance(answer, grpc.RpcError), answer
                hints[proc.address] = dict(answer.trailing_metadata() or ())[LEADER_HINT_KEY]
            if set(hints.values()) == {str(node_ids[active.address])}:
                break
            assert time.monotonic() < deadline, hints
            time.sleep(0.2)
        assert registered.controller_epoch >= 1
        broker_epoch, token = registered.broker_epoch, registered.control_token
        assert heartbeat(active.address, 1, broker_epoch, token).error_code == pb.NONE

        active.stop()  # SIGKILL
        survivors = [p for p in procs if p is not active]
        successor, second, _ = find_active(survivors, 2, "b" * 32)
        assert successor is not active
        # The controller epoch is the new Raft epoch: higher than the dead leader's.
        assert second.controller_epoch > registered.controller_epoch
        # Broker 1's registration (epoch and token) is in the successor's image.
        answer = heartbeat(successor.address, 1, broker_epoch, token)
        assert answer.error_code == pb.NONE, answer
        assert answer.controller_epoch == second.controller_epoch
        assert heartbeat(successor.address, 1, broker_epoch + 1000, token).error_code == (
            pb.STALE_BROKER_EPOCH)

        # The killed controller restarts as a standby, replays, and refuses.
        active.start()
        answer = register(active.address, 3, "c" * 32)
        assert isinstance(answer, grpc.RpcError) and "NOT_CONTROLLER" in answer.details()
    finally:
        for proc in procs:
            proc.stop()


def test_a_controller_not_among_the_voters_does_not_start(tmp_path):
    config = ControllerConfig(data_dir=tmp_path)
    config.apply_settings(["node.id=7", "controller.quorum.voters=1@127.0.0.1:1"])
    with pytest.raises(Exception, match="does not list node.id 7"):
        config.quorum_config()


def test_controller_quorum_listen_binds_elsewhere_than_the_voter_entry(tmp_path):
    """A container's controller binds its Raft port on 0.0.0.0 (controller.quorum.listen)
    while its peers reach it by the host name in controller.quorum.voters."""
    config = ControllerConfig(data_dir=tmp_path)
    config.apply_settings(["node.id=2", "controller.quorum.voters=1@c-1:9093,2@c-2:9093",
                           "controller.quorum.listen=0.0.0.0:9093"])
    quorum = config.quorum_config()
    assert str(quorum.listen_endpoint) == "0.0.0.0:9093"
    assert {i: str(e) for i, e in quorum.peers.items()} == {1: "c-1:9093"}
    config.apply_settings(["controller.quorum.listen=no-port"])
    with pytest.raises(Exception, match="controller.quorum.listen"):
        config.quorum_config()


def _app() -> MetadataApplication:
    return MetadataApplication(ControllerStateMachine(ControllerConfig()))


def test_the_snapshot_image_restores_the_same_metadata():
    app = _app()
    records = [{"type": "cluster", "cluster_id": "c" * 32},
               {"type": "controller_epoch", "epoch": 4}]
    app.apply(Entry(0, 4, EntryKind.LEADER_CHANGE, b""))
    for i, record in enumerate(records, start=1):
        app.apply(Entry(i, 4, EntryKind.DATA, encode_record(record)))
    assert app.applied_offset == 3
    assert app.machine.metadata.controller_epoch == 4
    other = _app()
    other.restore(app.image(), 3)
    assert other.applied_offset == 3
    assert other.machine.metadata.last_offset == 2  # the snapshot's last offset, not a count
    assert other.machine.metadata.snapshot_records() == app.machine.metadata.snapshot_records()
    assert isinstance(other.machine.metadata, ClusterMetadata)
    with pytest.raises(InvariantViolation):
        other.restore(app.image(), 5)  # an image of another offset


def test_a_committed_record_that_does_not_apply_is_an_invariant_violation():
    app = _app()
    app.apply(Entry(0, 1, EntryKind.DATA, encode_record({"type": "controller_epoch",
                                                         "epoch": 3})))
    with pytest.raises(InvariantViolation, match="does not apply"):
        app.apply(Entry(1, 1, EntryKind.DATA, encode_record({"type": "controller_epoch",
                                                             "epoch": 2})))
    with pytest.raises(InvariantViolation, match="not a JSON record"):
        app.apply(Entry(2, 1, EntryKind.DATA, b"\xff"))
    with pytest.raises(InvariantViolation, match="applied again"):
        app.apply(Entry(0, 1, EntryKind.DATA, b"{}"))
