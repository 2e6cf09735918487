"""The pure Authorizer (broker/security/authorizer.py) and the ACL model (proto/acls.py)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewater.broker.security.authorizer import Authorizer
from tidewater.proto import acls as a
from tidewater.proto.acls import Acl, AclFilter, InvalidAclError, validate

pytestmark = pytest.mark.timeout(60)


def acl(name="orders", op=a.READ, perm=a.ALLOW, principal="User:alice", host="*",
        pattern=a.LITERAL, rtype=a.TOPIC):
    return Acl(rtype, name, pattern, principal, host, op, perm)


def test_read_on_one_topic_allows_read_and_describe_only_there():
    z = Authorizer([acl()])
    assert z.authorize("User:alice", "10.0.0.1", a.READ, a.TOPIC, "orders")
    assert z.authorize("User:alice", "10.0.0.1", a.DESCRIBE, a.TOPIC, "orders")  # implied
    assert not z.authorize("User:alice", "10.0.0.1", a.WRITE, a.TOPIC, "orders")
    assert not z.authorize("User:bob", "10.0.0.1", a.READ, a.TOPIC, "orders")
    assert not z.authorize("User:alice", "10.0.0.1", a.READ, a.TOPIC, "other")  # no ACL: deny
    assert not z.authorize("User:alice", "10.0.0.1", a.CREATE, a.CLUSTER, a.CLUSTER_NAME)


def test_allow_everyone_if_no_acl_found():
    z = Authorizer([acl()], allow_if_no_acl=True)
    assert z.authorize("User:bob", "h", a.WRITE, a.TOPIC, "other")  # no ACL on it
    assert not z.authorize("User:bob", "h", a.READ, a.TOPIC, "orders")  # ACLs exist


def test_deny_wins_and_super_users_win_over_deny():
    rules = [acl(op=a.ALL), acl(op=a.READ, perm=a.DENY, principal="User:*")]
    z = Authorizer(rules, super_users=["User:admin"])
    assert not z.authorize("User:alice", "h", a.READ, a.TOPIC, "orders")
    assert z.authorize("User:alice", "h", a.WRITE, a.TOPIC, "orders")
    assert z.authorize("User:admin", "h", a.READ, a.TOPIC, "orders")


def test_deny_all_denies_describe_but_deny_read_does_not():
    z = Authorizer([acl(op=a.ALL), acl(op=a.READ, perm=a.DENY)])
    assert z.authorize("User:alice", "h", a.DESCRIBE, a.TOPIC, "orders")
    z = Authorizer([acl(op=a.ALL), acl(op=a.ALL, perm=a.DENY)])
    assert not z.authorize("User:alice", "h", a.DESCRIBE, a.TOPIC, "orders")


def test_prefixed_wildcard_and_host():
    z = Authorizer([acl(name="logs-", pattern=a.PREFIXED, op=a.WRITE),
                    acl(name="*", op=a.DESCRIBE, principal="User:*"),
                    acl(name="secret", op=a.READ, host="127.0.0.1")])
    assert z.authorize("User:alice", "h", a.WRITE, a.TOPIC, "logs-app")
    assert not z.authorize("User:alice", "h", a.WRITE, a.TOPIC, "log")
    assert z.authorize("User:carol", "h", a.DESCRIBE, a.TOPIC, "anything")
    assert z.authorize("User:alice", "127.0.0.1", a.READ, a.TOPIC, "secret")
    assert not z.authorize("User:alice", "127.0.0.2", a.READ, a.TOPIC, "secret")


def test_resource_types_do_not_mix():
    z = Authorizer([acl(name="g", rtype=a.GROUP)])
    assert z.authorize("User:alice", "h", a.READ, a.GROUP, "g")
    assert not z.authorize("User:alice", "h", a.READ, a.TOPIC, "g")


def test_describe_configs_implied_by_alter_configs():
    z = Authorizer([acl(op=a.ALTER_CONFIGS)])
    assert z.authorize("User:alice", "h", a.DESCRIBE_CONFIGS, a.TOPIC, "orders")
    assert not z.authorize("User:alice", "h", a.READ, a.TOPIC, "orders")


@pytest.mark.parametrize("bad", [
    acl(rtype=9), acl(pattern=a.PATTERN_MATCH), acl(op=a.OP_ANY), acl(perm=a.PERMISSION_ANY),
    acl(name=""), acl(rtype=a.CLUSTER, name="c"), acl(name="*", pattern=a.PREFIXED),
    acl(principal="alice"), acl(principal="Group:x"), acl(principal="User:"), acl(host=""),
])
def test_invalid_bindings_are_refused(bad):
    with pytest.raises(InvalidAclError):
        validate(bad)


def test_valid_binding_round_trips():
    b = acl(rtype=a.CLUSTER, name=a.CLUSTER_NAME, op=a.ALTER)
    validate(b)
    assert Acl.from_json(b.to_json()) == b
    assert Acl.from_pb(b.to_pb()) == b


def test_filters():
    rules = [acl(), acl(name="o", pattern=a.PREFIXED), acl(name="*"), acl(name="x"),
             acl(principal="User:bob", op=a.WRITE)]
    match = AclFilter(a.TOPIC, "orders", a.PATTERN_MATCH)
    assert [r.resource_name for r in rules if match.matches(r)] == ["orders", "o", "*", "orders"]
    literal = AclFilter(a.TOPIC, "orders", a.LITERAL)
    assert sum(literal.matches(r) for r in rules) == 2
    assert [r.principal for r in rules if AclFilter(operation=a.WRITE).matches(r)] == ["User:bob"]
    assert all(AclFilter().matches(r) for r in rules)


names = st.sampled_from(["orders", "ord", "o", "*", "logs"])
acls = st.builds(Acl, st.sampled_from([a.TOPIC, a.GROUP]), names,
                 st.sampled_from([a.LITERAL, a.PREFIXED]),
                 st.sampled_from(["User:alice", "User:*", "User:bob"]), st.just("*"),
                 st.sampled_from(list(a.OPERATION_NAMES)), st.sampled_from([a.ALLOW, a.DENY]))


@given(st.lists(acls, max_size=8), names, st.sampled_from(list(a.OPERATION_NAMES)))
def test_adding_a_deny_never_grants_and_adding_an_allow_never_refuses(rules, name, op):
    base = Authorizer(rules).authorize("User:alice", "h", op, a.TOPIC, name)
    deny = acl(name=name, op=op, perm=a.DENY)
    assert not Authorizer([*rules, deny]).authorize("User:alice", "h", op, a.TOPIC, name)
    allow = acl(name=name, op=op)
    with_allow = Authorizer([*rules, allow]).authorize("User:alice", "h", op, a.TOPIC, name)
    assert with_allow or not base  # more allows never take a permission away


def test_authorize_any_for_idempotent_producers():
    z = Authorizer([acl(name="logs-", pattern=a.PREFIXED, op=a.WRITE)])
    assert z.authorize_any("User:alice", "h", a.WRITE, a.TOPIC)
    assert not z.authorize_any("User:bob", "h", a.WRITE, a.TOPIC)
    assert not z.authorize_any("User:alice", "h", a.READ, a.TOPIC)
    denied = Authorizer([acl(name="logs-", pattern=a.PREFIXED, op=a.WRITE),
                         acl(name="*", op=a.WRITE, perm=a.DENY)])
    assert not denied.authorize_any("User:alice", "h", a.WRITE, a.TOPIC)
    assert Authorizer([], super_users=["User:root"]).authorize_any("User:root", "h", a.WRITE,
                                                                   a.TOPIC)
    assert Authorizer([], allow_if_no_acl=True).authorize_any("User:x", "h", a.WRITE, a.TOPIC)
    assert not Authorizer([]).authorize_any("User:x", "h", a.WRITE, a.TOPIC)
