"""Users and ACLs in the controller: records, replay, snapshots, brokers' UpdateMetadata,
and a failed metadata-log write that changes nothing."""

import errno
import os

import pytest
from controller_harness import Harness

from tidewater.controller import requests
from tidewater.controller.metadata import ClusterMetadata
from tidewater.controller.owner import ImageAheadOfDiskError
from tidewater.proto import acls as a
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.scram import credential_to_pb, make_credential, password_matches

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "ctl")
    yield harness
    harness.log.close()


def upsert(h, user, password, derive_with="SCRAM-SHA-512", **fields):
    c = credential_to_pb(user, make_credential(derive_with, password))
    for k, v in fields.items():
        setattr(c, k, v)
    return h.run(h.machine.alter_user_scram_credentials,
                 pb.AlterUserScramCredentialsRequest(upsertions=[c]))


READ_ORDERS = a.Acl(a.TOPIC, "orders", a.LITERAL, "User:alice", "*", a.READ, a.ALLOW)


def test_user_credentials_are_stored_derived_and_survive_a_restart(h):
    assert upsert(h, "alice", "pw").results[0].error_code == pb.NONE
    assert upsert(h, "alice", "pw", "SCRAM-SHA-256").results[0].error_code == pb.NONE
    stored = h.metadata.security.credentials[("alice", "SCRAM-SHA-512")]
    assert password_matches(stored, "pw")
    raw = b"".join((h.data_dir / n).read_bytes() for n in os.listdir(h.data_dir)
                   if (h.data_dir / n).is_file())
    assert b'"pw"' not in raw and stored.stored_key.hex().encode() in raw
    h2 = h.restart()
    assert h2.metadata.security.credentials == h.metadata.security.credentials
    described = h2.run(h2.machine.describe_user_scram_credentials,
                       pb.DescribeUserScramCredentialsRequest(users=["alice", "bob"]))
    assert [(u.user, u.error_code, list(u.mechanisms)) for u in described.users] == [
        ("alice", pb.NONE, ["SCRAM-SHA-256", "SCRAM-SHA-512"]),
        ("bob", pb.RESOURCE_NOT_FOUND, [])]
    h2.log.close()


def test_bad_credentials_are_refused_and_store_nothing(h):
    before = h.log.next_offset
    assert upsert(h, "alice", "pw", iterations=10).results[0].error_code == \
        pb.UNACCEPTABLE_CREDENTIAL
    assert upsert(h, "alice", "pw", "SCRAM-SHA-256", mechanism="SCRAM-SHA-1").results[0].error_code == \
        pb.UNACCEPTABLE_CREDENTIAL
    assert upsert(h, "alice", "pw", stored_key=b"short").results[0].error_code == \
        pb.UNACCEPTABLE_CREDENTIAL
    assert upsert(h, "", "pw").results[0].error_code == pb.UNACCEPTABLE_CREDENTIAL
    deleted = h.run(h.machine.alter_user_scram_credentials, pb.AlterUserScramCredentialsRequest(
        deletions=[pb.ScramCredential(user="nobody", mechanism="SCRAM-SHA-256")]))
    assert deleted.results[0].error_code == pb.RESOURCE_NOT_FOUND
    assert h.log.next_offset == before and not h.metadata.security.credentials


def test_acls_create_describe_delete_and_replay(h):
    other = a.Acl(a.TOPIC, "logs-", a.PREFIXED, "User:*", "*", a.WRITE, a.DENY)
    created = h.run(h.machine.create_acls, pb.CreateAclsRequest(creations=[
        READ_ORDERS.to_pb(), other.to_pb(), pb.AclBinding(resource_type=9)]))
    assert [r.error_code for r in created.results] == [pb.NONE, pb.NONE, pb.INVALID_REQUEST]
    assert h.metadata.security.acls == {READ_ORDERS, other}
    again = h.log.next_offset
    h.run(h.machine.create_acls, pb.CreateAclsRequest(creations=[READ_ORDERS.to_pb()]))
    assert h.log.next_offset == again  # already there: no record
    found = h.run(h.machine.describe_acls, pb.DescribeAclsRequest(filter=pb.AclBinding(
        resource_type=a.TOPIC, resource_name="logs-app", pattern_type=a.PATTERN_MATCH)))
    assert [a.Acl.from_pb(b) for b in found.acls] == [other]
    h2 = h.restart()
    assert h2.metadata.security.acls == {READ_ORDERS, other}
    deleted = h2.run(h2.machine.delete_acls, pb.DeleteAclsRequest(filters=[
        pb.AclBinding(principal="User:alice")]))
    assert [a.Acl.from_pb(b) for b in deleted.results[0].deleted] == [READ_ORDERS]
    assert h2.metadata.security.acls == {other}
    h3 = h2.restart()
    assert h3.metadata.security.acls == {other}
    h3.log.close()


def test_snapshot_records_rebuild_users_and_acls(h):
    upsert(h, "alice", "pw")
    h.run(h.machine.create_acls, pb.CreateAclsRequest(creations=[READ_ORDERS.to_pb()]))
    rebuilt = ClusterMetadata()
    for i, record in enumerate(h.metadata.snapshot_records()):
        rebuilt.apply(i, record)
    assert rebuilt.security == h.metadata.security


def test_brokers_get_users_and_acls_in_update_metadata(h):
    assert h.register(1).error_code == pb.NONE
    upsert(h, "alice", "pw")
    h.run(h.machine.create_acls, pb.CreateAclsRequest(creations=[READ_ORDERS.to_pb()]))
    assert h.effects[-1].metadata_changed  # so every broker gets a new UpdateMetadata
    update = requests.update_metadata(h.metadata, 0, 1)
    assert [(c.user, c.mechanism) for c in update.scram_credentials] == [
        ("alice", "SCRAM-SHA-512")]
    assert [a.Acl.from_pb(b) for b in update.acls] == [READ_ORDERS]


class FullDisk:
    def __init__(self, file):
        self._file = file

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._file, name)


@pytest.mark.parametrize("change", ["user", "acl", "delete_acl"])
def test_a_failed_write_of_a_user_or_acl_record_changes_nothing(h, change):
    upsert(h, "alice", "pw")
    h.run(h.machine.create_acls, pb.CreateAclsRequest(creations=[READ_ORDERS.to_pb()]))
    before_offset = h.log.next_offset
    h.log._file = FullDisk(h.log._file)
    with pytest.raises(ImageAheadOfDiskError):
        if change == "user":
            upsert(h, "bob", "pw")
        elif change == "acl":
            h.run(h.machine.create_acls, pb.CreateAclsRequest(creations=[
                READ_ORDERS.to_pb().__class__(resource_type=a.TOPIC, resource_name="x",
                                              pattern_type=a.LITERAL, principal="User:bob",
                                              host="*", operation=a.READ,
                                              permission_type=a.ALLOW)]))
        else:
            h.run(h.machine.delete_acls, pb.DeleteAclsRequest(filters=[pb.AclBinding()]))
    assert h.fatal  # the controller stops: it never answers from an image the log lacks
    h.log._file = h.log._file._file
    assert h.log.next_offset == before_offset
    h.log.close()
    h2 = Harness(h.data_dir)
    assert set(u for u, _ in h2.metadata.security.credentials) == {"alice"}
    assert h2.metadata.security.acls == {READ_ORDERS}
    h2.log.close()
    h.log = h2.log  # the fixture closes it again (closing twice is harmless)
