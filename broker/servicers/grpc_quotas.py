"""Client quotas on the gRPC listeners: the Kafka listener's ``producer_byte_rate`` and
``consumer_byte_rate`` (``broker/kafka/client_quotas.py``, one set of rates per broker)
charged for gRPC Produce, ProduceStream, Fetch and FetchStream too, so a client cannot
leave its quota behind by changing port.

Who is charged: the call's authenticated user (Kafka's quota user: ``alice`` of
``User:alice``; ``ANONYMOUS`` without authentication) and the ``client-id`` call
metadata when the client sends one (Tidewater's clients send none, so a gRPC client
matches a ``clients`` quota only through ``--entity-default``).

How a client is held back: gRPC has no ``throttle_time_ms`` field to honour, so the
broker delays, as Kafka did before KIP-219: a unary call's answer is sent after the
throttle time; a stream reads its next request only after it (the client's requests in
flight fill up and it waits). A fetch is charged the records it carries, a produce the
records it sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from tidewater.broker.clock import mono_ms
from tidewater.broker.kafka.client_quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    ClientQuotas,
)
from tidewater.broker.kafka.client_quotas import quota_user as principal_quota_user
from tidewater.broker.security.authorizer import Session
from tidewater.proto import tidewater_pb2 as pb
from tidewater.proto.acls import ANONYMOUS

CLIENT_ID_METADATA_KEY = "client-id"


def quota_user(session: Session | None) -> str:
    """Kafka's quota user of a call's caller (``ANONYMOUS`` when security is off)."""
    return principal_quota_user(session.principal if session is not None else ANONYMOUS)


def client_id_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    for key, value in metadata or ():
        if key == CLIENT_ID_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return ""


def produce_bytes(request: pb.ProduceRequest) -> int:
    return sum(len(p.records) for p in request.partitions)


def fetch_bytes(response: pb.FetchResponse) -> int:
    return sum(len(p.records) for p in response.partitions)


class GrpcQuotas:
    """Charges gRPC produce and fetch traffic to the broker's ``ClientQuotas`` (read
    through ``quotas_of``, since a metadata snapshot may replace the object)."""

    def __init__(self, quotas_of: Callable[[], ClientQuotas],
                 clock_ms: Callable[[], int] = mono_ms) -> None:
        self._quotas_of = quotas_of
        self._clock_ms = clock_ms

    def charge(self, key: str, user: str, client_id: str, value_bytes: int) -> int:
        """Record ``value_bytes`` against (user, client-id)'s ``key`` rate; the throttle
        time in ms (0: not over its quota, or none applies)."""
        decision = self._quotas_of().record(key, user, client_id, value_bytes, self._clock_ms())
        return decision.throttle_time_ms

    def charge_produce(self, user: str, client_id: str, request: pb.ProduceRequest) -> int:
        return self.charge(PRODUCER_BYTE_RATE, user, client_id, produce_bytes(request))

    def charge_fetch(self, user: str, client_id: str, response: pb.FetchResponse) -> int:
        return self.charge(CONSUMER_BYTE_RATE, user, client_id, fetch_bytes(response))


async def hold(throttle_ms: int) -> None:
    """Wait out a throttle (the pre-KIP-219 delay)."""
    if throttle_ms > 0:
        await asyncio.sleep(throttle_ms / 1000)
