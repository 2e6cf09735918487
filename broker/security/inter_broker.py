"""What a broker presents on other brokers' INTERNAL listeners, and who may fetch as a
follower there.

Kafka's brokers authenticate to each other as a broker principal (a SASL user or a
certificate's CN, listed in ``super.users``), and a follower fetch needs CLUSTER_ACTION
on the cluster from it. Here, with SASL or an authorizer configured, a leader takes
ReplicaFetch only from a caller that

1. authenticates (``grpc_auth.grpc_session``: the ``authorization: PLAIN`` call metadata
   a follower sends from ``inter.broker.credentials.file``, or its verified client
   certificate on an mTLS INTERNAL listener), and
2. may CLUSTER_ACTION on the cluster (``may_fetch_as_follower``): with an authorizer,
   as the ACLs say (super users may); without one (SASL only), only a super user may,
   since every SASL client user authenticates too and must not move a high watermark.

The credentials file is Kafka's client properties format (``sasl.username``,
``sasl.password``), as ``tide cluster up`` writes it (mode 0600) for the ``broker``
user: the password never appears on a command line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tidewater.broker.security.authorizer import Session
from tidewater.proto.acls import CLUSTER, CLUSTER_ACTION, CLUSTER_NAME
from tidewater.proto.scram import plain_metadata

CallMetadata = tuple[tuple[str, str], ...]


class CredentialsFileError(ValueError):
    """``inter.broker.credentials.file`` cannot be read or lacks a user or password."""


@dataclass(frozen=True)
class InterBrokerCredentials:
    username: str
    password: str = field(repr=False)

    @classmethod
    def read(cls, path: str | Path) -> InterBrokerCredentials:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise CredentialsFileError(f"cannot read {path}: {e}") from None
        values: dict[str, str] = {}
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "!")) and "=" in line:
                name, _, value = line.partition("=")
                values[name.strip()] = value.strip()
        username, password = values.get("sasl.username"), values.get("sasl.password")
        if not username or not password:
            raise CredentialsFileError(f"{path}: needs sasl.username and sasl.password")
        return cls(username, password)

    def call_metadata(self) -> CallMetadata:
        """What each of this broker's calls to a leader carries (SASL/PLAIN over gRPC)."""
        return (plain_metadata(self.username, self.password),)


def may_fetch_as_follower(session: Session, *, has_authorizer: bool,
                          allows: Callable[[Session, int, int, str], bool],
                          super_users: frozenset[str]) -> bool:
    """May ``session`` send follower fetches (move high watermarks, read uncommitted
    records of every topic)? CLUSTER_ACTION on the cluster; without an authorizer, only
    a super user (no ACLs to grant it to anyone else)."""
    if has_authorizer:
        return allows(session, CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)
    return session.principal in super_users
