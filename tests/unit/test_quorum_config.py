"""controller.quorum.voters / --initial-controllers parsing, and the inbound peer address."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidewater.controller.quorum.config import (
    Endpoint,
    QuorumConfig,
    parse_endpoints,
    parse_initial_controllers,
)
from tidewater.controller.quorum.transport import peer_host
from tidewater.controller.raft import VoterKey
from tidewater.proto.errors import InvalidConfigError

pytestmark = pytest.mark.timeout(30)


def test_voters_parse_as_kafka_writes_them() -> None:
    assert parse_endpoints("1@127.0.0.1:9093, 2@ctl-2:9093") == {
        1: Endpoint("127.0.0.1", 9093), 2: Endpoint("ctl-2", 9093)}
    for bad in ("1@host", "x@host:1", "1@host:0", "1@host:70000", "1@a:1,1@b:2"):
        with pytest.raises(InvalidConfigError):
            parse_endpoints(bad)


def test_initial_controllers_carry_directory_ids() -> None:
    assert parse_initial_controllers(f"1@h:1:{'ab' * 16},2@h:2:{'cd' * 16}") == frozenset(
        {VoterKey(1, "ab" * 16), VoterKey(2, "cd" * 16)})
    for bad in ("", "1@h:1", f"1@h:1:{'AB' * 16}", f"1@h:1:{'ab' * 15}"):
        with pytest.raises(InvalidConfigError):
            parse_initial_controllers(bad)


def test_a_node_must_know_where_it_listens(tmp_path: Path) -> None:
    voters = {1: Endpoint("127.0.0.1", 1), 2: Endpoint("127.0.0.1", 2)}
    config = QuorumConfig(node_id=1, data_dir=tmp_path, voters=voters,
                          observers={3: Endpoint("127.0.0.1", 3)})
    assert config.listen_endpoint == Endpoint("127.0.0.1", 1)
    assert sorted(config.peers) == [2, 3]
    with pytest.raises(InvalidConfigError, match="neither"):
        QuorumConfig(node_id=4, data_dir=tmp_path, voters=voters)
    with pytest.raises(InvalidConfigError, match="both"):
        QuorumConfig(node_id=1, data_dir=tmp_path, voters=voters,
                     observers={2: Endpoint("127.0.0.1", 2)})


def test_peer_host_from_grpc_peer_strings() -> None:
    assert peer_host("ipv4:127.0.0.1:5555") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:5555") == "::1"
    assert peer_host("unix:/tmp/x") is None
