"""Bootstrap handling and broker fail-over of MetadataClient, without sockets."""

import pytest

from client.metadata import BrokerConnectionError, MetadataClient
from proto.errors import RequestTimedOutError


def make_client():
    return MetadataClient("h1:1,h2:2,h3:3")


def test_connection_errors_move_on_and_the_last_good_broker_goes_first():
    client = make_client()
    tried = []

    def call(address):
        tried.append(address)
        if address != ("h3", 3):
            raise BrokerConnectionError("down")
        return "ok"

    assert client.any_broker_call(call) == "ok"
    assert tried == [("h1", 1), ("h2", 2), ("h3", 3)]
    tried.clear()
    assert client.any_broker_call(call) == "ok"
    assert tried == [("h3", 3)]


def test_no_broker_reachable_names_every_address():
    client = make_client()

    def call(address):
        raise BrokerConnectionError("refused")

    with pytest.raises(BrokerConnectionError, match="no broker reachable.*h1:1, h2:2, h3:3"):
        client.any_broker_call(call)


def test_timeouts_move_on_only_when_safe():
    client = make_client()
    tried = []

    def call(address):
        tried.append(address)
        if address == ("h1", 1):
            raise RequestTimedOutError("slow")
        return address

    assert client.any_broker_call(call) == ("h2", 2)
    client._last_good = None
    tried.clear()
    with pytest.raises(RequestTimedOutError):
        client.any_broker_call(call, retry_on_timeout=False)
    assert tried == [("h1", 1)]
