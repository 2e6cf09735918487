"""Who may fetch as a follower (``broker.security.inter_broker``), and the brokers' own
credentials file."""

from __future__ import annotations

import pytest

from tidewater.broker.config import BrokerConfig, ConfigError
from tidewater.broker.security.authorizer import Session
from tidewater.broker.security.inter_broker import (
    CredentialsFileError,
    InterBrokerCredentials,
    may_fetch_as_follower,
)
from tidewater.broker.security.settings import BrokerSecurity, SecuritySettings
from tidewater.proto.acls import ALLOW, CLUSTER, CLUSTER_ACTION, CLUSTER_NAME, LITERAL, Acl
from tidewater.proto.scram import AUTHORIZATION_KEY

pytestmark = pytest.mark.timeout(30)


class _Cache:
    def __init__(self, acls=()):
        self._acls = tuple(acls)

    def scram_credential(self, user, mechanism):
        return None

    def user_credentials(self, user):
        return []

    def acls(self):
        return self._acls

    def scram_iterations(self, mechanism):
        return []


def _security(acls=(), **settings) -> BrokerSecurity:
    return BrokerSecurity(SecuritySettings(**settings), _Cache(acls))


def test_without_an_authorizer_only_a_super_user_fetches_as_a_follower():
    security = _security(sasl_mechanisms=("PLAIN",), super_users=frozenset({"User:broker"}))
    assert security.may_fetch_as_follower(Session("User:broker", "h"))
    assert not security.may_fetch_as_follower(Session("User:alice", "h"))
    assert not security.may_fetch_as_follower(Session("User:ANONYMOUS", "h"))


def test_with_an_authorizer_cluster_action_decides():
    grant = Acl(principal="User:replicator", host="*", resource_type=CLUSTER,
                resource_name=CLUSTER_NAME, pattern_type=LITERAL, operation=CLUSTER_ACTION,
                permission=ALLOW)
    security = _security([grant], authorizer="acl", super_users=frozenset({"User:broker"}))
    assert security.may_fetch_as_follower(Session("User:broker", "h"))
    assert security.may_fetch_as_follower(Session("User:replicator", "h"))
    assert not security.may_fetch_as_follower(Session("User:alice", "h"))


def test_the_rule_asks_the_authorizer_for_cluster_action_on_the_cluster():
    asked = []
    may_fetch_as_follower(Session("User:x"), has_authorizer=True, super_users=frozenset(),
                          allows=lambda s, op, kind, name: asked.append((op, kind, name)))
    assert asked == [(CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)]


def test_the_credentials_file(tmp_path):
    path = tmp_path / "broker.properties"
    path.write_text("# comment\nsasl.username=broker\nsasl.password=s3cret=x\n")
    credentials = InterBrokerCredentials.read(path)
    assert (credentials.username, credentials.password) == ("broker", "s3cret=x")
    assert "s3cret" not in repr(credentials)
    [(key, value)] = credentials.call_metadata()
    assert key == AUTHORIZATION_KEY and value.startswith("PLAIN ")
    path.write_text("sasl.username=broker\n")
    with pytest.raises(CredentialsFileError, match="sasl.password"):
        InterBrokerCredentials.read(path)
    config = BrokerConfig(broker_id=1, listen=("127.0.0.1", 0), controller=("x", 1),
                          data_dir=tmp_path)
    with pytest.raises(ConfigError, match="inter.broker.credentials.file"):
        config.apply_settings({"inter.broker.credentials.file": str(tmp_path / "missing")})
