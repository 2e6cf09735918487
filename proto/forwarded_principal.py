"""The principal a broker forwards an admin call for (Kafka's Envelope, KIP-590).

Brokers forward their clients' admin calls (CreateTopics, CreateAcls, ...) to the
controller on their own authenticated channel. So that forwarding is no way around
the controller's authorizer, the forwarding broker names the client it acts for in
two call metadata keys, and the controller authorizes the call as that client. The
controller takes the keys only from a cluster member (CLUSTER_ACTION on the cluster,
or a member certificate); anyone else sending them is refused, as Kafka refuses an
Envelope without CLUSTER_ACTION.

Inside a broker the client's principal travels in a context variable (``FORWARDED``):
the Kafka listener and the guarded gRPC forwarder set it for each request they
handle, and ``ControllerForwarder`` reads it when it calls the controller (asyncio
tasks copy the context they are created in, so a request's child tasks carry it).
Unset means the broker acts for itself (its group coordinator creating
``__consumer_offsets``).
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar

PRINCIPAL_KEY = "tidewater-forwarded-principal"
HOST_KEY = "tidewater-forwarded-host"
PRINCIPAL_CHARS_MAX = 300  # "User:" and a 255-byte user name, with room

# (principal, host) of the client a broker handles a request for; None: itself.
FORWARDED: ContextVar[tuple[str, str] | None] = ContextVar("tidewater_forwarded", default=None)


def forwarded_metadata() -> tuple[tuple[str, str], ...]:
    """The call metadata naming the client this task acts for (empty when none)."""
    forwarded = FORWARDED.get()
    if forwarded is None:
        return ()
    principal, host = forwarded
    return ((PRINCIPAL_KEY, principal), (HOST_KEY, host))


def forwarded_of(metadata: Iterable[tuple[str, str | bytes]]) -> tuple[str, str] | None:
    """(principal, host) a call's metadata names, or None; ValueError for a malformed one."""
    values = {k: v.decode(errors="replace") if isinstance(v, bytes) else v
              for k, v in metadata if k in (PRINCIPAL_KEY, HOST_KEY)}
    principal = values.get(PRINCIPAL_KEY)
    if principal is None:
        return None
    if (not principal.startswith("User:") or len(principal) > PRINCIPAL_CHARS_MAX
            or not principal.isprintable()):
        raise ValueError(f"bad forwarded principal {principal[:64]!r}")
    return principal, values.get(HOST_KEY, "")
