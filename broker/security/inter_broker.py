"""What a broker presents on other brokers' INTERNAL listeners, and who may fetch as a
follower there.

Kafka's brokers authenticate to each other as a broker principal (a SASL user or a
certificate's CN, listed in ``super.users``), and a follower fetch needs CLUSTER_ACTION
on the cluster from it. Here, with SASL or an authorizer configured, a leader takes
ReplicaFetch only from a caller that

1. authenticates (``grpc_auth.grpc_session``: as the user of
   ``inter.broker.credentials.file``, with a SCRAM exchange and its session token where
   a SCRAM mechanism is enabled, else with ``authorization: PLAIN`` call metadata; or
   with its verified client certificate on an mTLS INTERNAL listener), and
2. may CLUSTER_ACTION on the cluster (``may_fetch_as_follower``): with an authorizer,
   as the ACLs say (super users may); without one (SASL only), only a super user may,
   since every SASL client user authenticates too and must not move a high watermark.

The credentials file is Kafka's client properties format (``sasl.username``,
``sasl.password``), as ``tide cluster up`` writes it (mode 0600) for the ``broker``
user: the password never appears on a command line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidewater.broker.security.authorizer import Session
from tidewater.proto.acls import CLUSTER, CLUSTER_ACTION, CLUSTER_NAME
from tidewater.proto.scram import MECHANISMS, plain_metadata

if TYPE_CHECKING:  # grpc is imported only once proto/grpc_env.py set its environment
    import grpc

CallMetadata = tuple[tuple[str, str], ...]
# (target, channel options, TLS credentials or None) -> an aio channel to another broker
ChannelOpener = Callable[[str, Sequence[tuple[str, int]], Any], "grpc.aio.Channel"]


def inter_broker_mechanism(enabled: Sequence[str], configured: str = "") -> str:
    """The mechanism a broker authenticates with to the controller and other brokers:
    ``configured`` (Kafka's ``sasl.mechanism.inter.broker.protocol``; the broker's
    config checks it is an enabled one) if set; else SCRAM (SHA-512 before SHA-256)
    where enabled, so no password crosses the network; PLAIN only where no SCRAM
    mechanism is (or no mechanism is named)."""
    if configured:
        return configured
    for preferred in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
        if preferred in enabled:
            return preferred
    return "PLAIN"


def open_channel_as(user: str, password: str, mechanism: str) -> ChannelOpener:
    """Opens channels whose calls authenticate as ``user``: with SCRAM, each channel runs
    a SCRAM exchange and sends its session token (``client.sasl_session``); with PLAIN the
    channel is plain and the caller sends ``plain_metadata`` on each call."""
    def open_channel(target: str, options: Sequence[tuple[str, int]],
                     credentials: Any) -> grpc.aio.Channel:
        from tidewater.client.sasl_session import ScramLogin
        from tidewater.client.security import scram_aio_channel
        from tidewater.proto.tls import open_aio_channel
        if mechanism in MECHANISMS:
            return scram_aio_channel(target, options, credentials,
                                     ScramLogin(mechanism, user, password))
        return open_aio_channel(target, options, credentials)
    return open_channel


def plain_channel(target: str, options: Sequence[tuple[str, int]],
                  credentials: Any) -> grpc.aio.Channel:
    """A channel that authenticates by itself with nothing but TLS, if any."""
    from tidewater.proto.tls import open_aio_channel
    return open_aio_channel(target, options, credentials)


class CredentialsFileError(ValueError):
    """``inter.broker.credentials.file`` cannot be read or lacks a user or password."""


@dataclass(frozen=True)
class InterBrokerCredentials:
    username: str
    password: str = field(repr=False)
    mechanism: str = "PLAIN"  # inter_broker_mechanism of the broker's enabled ones

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
        """What each of this broker's calls to a leader carries: the password with PLAIN;
        nothing with SCRAM (its channels carry their session: ``open_channel``)."""
        if self.mechanism in MECHANISMS:
            return ()
        return (plain_metadata(self.username, self.password),)

    @property
    def open_channel(self) -> ChannelOpener:
        return open_channel_as(self.username, self.password, self.mechanism)


def may_fetch_as_follower(session: Session, *, has_authorizer: bool,
                          allows: Callable[[Session, int, int, str], bool],
                          super_users: frozenset[str]) -> bool:
    """May ``session`` send follower fetches (move high watermarks, read uncommitted
    records of every topic)? CLUSTER_ACTION on the cluster; without an authorizer, only
    a super user (no ACLs to grant it to anyone else)."""
    if has_authorizer:
        return allows(session, CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)
    return session.principal in super_users
