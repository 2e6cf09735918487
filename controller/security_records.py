"""Users (SCRAM credentials) and ACLs: their part of the metadata image, their records,
and the controller's commands on them (pure; ``state_machine`` style, time not needed).

Records in the metadata log (``metadata`` applies them through ``SecurityImage``):

=========================  ===================================================
type                       fields
=========================  ===================================================
scram_credential           user, mechanism, salt (hex), iterations, stored_key
                           (hex), server_key (hex): set or replace one
                           mechanism's credential of a user (never a password)
scram_credential_deleted   user, mechanism
acl_created                resource_type, resource_name, pattern_type,
                           principal, host, operation, permission (Kafka's
                           numbers, ``proto.acls``)
acl_deleted                the same fields
=========================  ===================================================

Every change is a record appended through ``Tx``, so it is durable before
it is answered and, as any committed change, reaches every broker in the next
full ``UpdateMetadata`` (``scram_credentials``, ``acls``). A failed write
leaves the image poisoned and the controller stops (``owner``): a change
either is in the log or never happened.

Credentials arrive derived (``ScramCredential`` with salt, iterations,
StoredKey, ServerKey), as in Kafka's AlterUserScramCredentials: the password
never reaches the controller.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import Acl, AclFilter, InvalidAclError, validate
from tidewater.proto.scram import (
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    MECHANISMS,
    USER_NAME_BYTES_MAX,
    ScramCredential,
    credential_from_pb,
    credential_to_pb,
)

if TYPE_CHECKING:
    from tidewater.controller.metadata_log import MetadataRecord
    from tidewater.controller.state_machine import Tx

ACLS_MAX = 100_000
USERS_MAX = 100_000
ITEMS_PER_REQUEST_MAX = 1_000
_KEY_BYTES = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}
SALT_BYTES_MAX = 256


@dataclass
class SecurityImage:
    credentials: dict[tuple[str, str], ScramCredential] = field(default_factory=dict)
    acls: set[Acl] = field(default_factory=set)

    def apply(self, kind: str, r: MetadataRecord) -> None:
        if kind == "scram_credential":
            credential = ScramCredential(
                str(r["mechanism"]), bytes.fromhex(r["salt"]), int(r["iterations"]),
                bytes.fromhex(r["stored_key"]), bytes.fromhex(r["server_key"]))
            self.credentials[(str(r["user"]), credential.mechanism)] = credential
        elif kind == "scram_credential_deleted":
            del self.credentials[(str(r["user"]), str(r["mechanism"]))]
        elif kind == "acl_created":
            self.acls.add(Acl.from_json(r))
        elif kind == "acl_deleted":
            self.acls.remove(Acl.from_json(r))
        else:
            raise ValueError(f"not a security record: {kind}")

    def snapshot_records(self) -> list[MetadataRecord]:
        records = [scram_credential_record(user, c)
                   for (user, _), c in sorted(self.credentials.items())]
        records += [acl_record("acl_created", acl) for acl in sorted(self.acls)]
        return records

    def credentials_pb(self) -> list[pb.ScramCredential]:
        return [credential_to_pb(user, c) for (user, _), c in sorted(self.credentials.items())]

    def acls_pb(self) -> list[pb.AclBinding]:
        return [acl.to_pb() for acl in sorted(self.acls)]


RECORD_TYPES = ("scram_credential", "scram_credential_deleted", "acl_created", "acl_deleted")


def scram_credential_record(user: str, c: ScramCredential) -> MetadataRecord:
    return {"type": "scram_credential", "user": user, "mechanism": c.mechanism,
            "salt": c.salt.hex(), "iterations": c.iterations, "stored_key": c.stored_key.hex(),
            "server_key": c.server_key.hex()}


def acl_record(kind: str, acl: Acl) -> MetadataRecord:
    return {"type": kind, **acl.to_json()}


# ---------------------------------------------------------------- commands

def _user_refusal(user: str, mechanism: str) -> str | None:
    if not user or len(user.encode()) > USER_NAME_BYTES_MAX:
        return "user name is empty or longer than 255 bytes"
    if mechanism not in MECHANISMS:
        return f"mechanism {mechanism!r} is not one of {', '.join(MECHANISMS)}"
    return None


def alter_user_scram_credentials(tx: Tx, image: SecurityImage,
                                 req: pb.AlterUserScramCredentialsRequest,
                                 ) -> pb.AlterUserScramCredentialsResponse:
    """Kafka's rules: a user named twice in one request is refused everywhere it appears
    (DUPLICATE_RESOURCE is not ours: INVALID_REQUEST); unknown mechanism or iterations
    out of range UNACCEPTABLE_CREDENTIAL; deleting what is not there RESOURCE_NOT_FOUND."""
    response = pb.AlterUserScramCredentialsResponse()
    counts = Counter((c.user, c.mechanism) for c in [*req.upsertions, *req.deletions])
    items = [(c, True) for c in req.upsertions] + [(c, False) for c in req.deletions]
    users_after = {u for u, _ in image.credentials}
    for c, upsert in items:
        result = response.results.add(user=c.user, error_code=pb.NONE)
        if len(items) > ITEMS_PER_REQUEST_MAX:
            result.error_code, result.error_message = (
                pb.INVALID_REQUEST, f"more than {ITEMS_PER_REQUEST_MAX} alterations")
            continue
        if message := _user_refusal(c.user, c.mechanism):
            result.error_code, result.error_message = pb.UNACCEPTABLE_CREDENTIAL, message
            continue
        if counts[(c.user, c.mechanism)] > 1:
            result.error_code, result.error_message = (
                pb.INVALID_REQUEST, "the same user and mechanism twice in one request")
            continue
        if upsert:
            size = _KEY_BYTES[c.mechanism]
            if not ITERATIONS_MIN <= c.iterations <= ITERATIONS_MAX:
                result.error_code, result.error_message = (
                    pb.UNACCEPTABLE_CREDENTIAL,
                    f"iterations {c.iterations} outside {ITERATIONS_MIN}..{ITERATIONS_MAX}")
            elif (len(c.stored_key) != size or len(c.server_key) != size or not c.salt
                  or len(c.salt) > SALT_BYTES_MAX):
                result.error_code, result.error_message = (
                    pb.UNACCEPTABLE_CREDENTIAL, f"{c.mechanism} keys are {size} bytes, "
                    f"a salt 1..{SALT_BYTES_MAX}")
            elif c.user not in users_after and len(users_after) >= USERS_MAX:
                result.error_code, result.error_message = (
                    pb.INVALID_REQUEST, f"more than {USERS_MAX} users")
            else:
                tx.append(scram_credential_record(c.user, credential_from_pb(c)))
                users_after.add(c.user)
        elif (c.user, c.mechanism) not in image.credentials:
            result.error_code, result.error_message = (
                pb.RESOURCE_NOT_FOUND, f"user {c.user!r} has no {c.mechanism} credential")
        else:
            tx.append({"type": "scram_credential_deleted", "user": c.user,
                       "mechanism": c.mechanism})
    return response


def describe_user_scram_credentials(image: SecurityImage,
                                    req: pb.DescribeUserScramCredentialsRequest,
                                    ) -> pb.DescribeUserScramCredentialsResponse:
    by_user: dict[str, list[ScramCredential]] = {}
    for (user, _), c in sorted(image.credentials.items()):
        by_user.setdefault(user, []).append(c)
    response = pb.DescribeUserScramCredentialsResponse()
    for user in (dict.fromkeys(req.users) if req.users else by_user):
        found = by_user.get(user, [])
        response.users.add(user=user, error_code=pb.NONE if found else pb.RESOURCE_NOT_FOUND,
                           mechanisms=[c.mechanism for c in found],
                           iterations=[c.iterations for c in found])
    return response


def create_acls(tx: Tx, image: SecurityImage, req: pb.CreateAclsRequest) -> pb.CreateAclsResponse:
    """Each creation answered in order; an ACL that exists already is NONE (no record)."""
    response = pb.CreateAclsResponse()
    for binding in req.creations:
        result = response.results.add(error_code=pb.NONE)
        acl = Acl.from_pb(binding)
        try:
            if len(req.creations) > ITEMS_PER_REQUEST_MAX:
                raise InvalidAclError(f"more than {ITEMS_PER_REQUEST_MAX} creations")
            validate(acl)
            if acl not in image.acls and len(image.acls) >= ACLS_MAX:
                raise InvalidAclError(f"the cluster holds {ACLS_MAX} ACLs already")
        except InvalidAclError as e:
            result.error_code, result.error_message = pb.INVALID_REQUEST, str(e)
            continue
        if acl not in image.acls:
            tx.append(acl_record("acl_created", acl))
    return response


def describe_acls(image: SecurityImage, req: pb.DescribeAclsRequest) -> pb.DescribeAclsResponse:
    wanted = AclFilter.from_pb(req.filter)
    return pb.DescribeAclsResponse(error_code=pb.NONE, acls=[
        acl.to_pb() for acl in sorted(image.acls) if wanted.matches(acl)])


def delete_acls(tx: Tx, image: SecurityImage, req: pb.DeleteAclsRequest) -> pb.DeleteAclsResponse:
    """Each filter deletes every ACL it matches (an ACL matched by two filters is deleted
    once, listed under the first)."""
    response = pb.DeleteAclsResponse()
    for binding in req.filters:
        wanted = AclFilter.from_pb(binding)
        result = response.results.add(error_code=pb.NONE)
        if len(req.filters) > ITEMS_PER_REQUEST_MAX:
            result.error_code = pb.INVALID_REQUEST
            result.error_message = f"more than {ITEMS_PER_REQUEST_MAX} filters"
            continue
        for acl in sorted(image.acls):
            if wanted.matches(acl):
                tx.append(acl_record("acl_deleted", acl))
                result.deleted.append(acl.to_pb())
    return response
