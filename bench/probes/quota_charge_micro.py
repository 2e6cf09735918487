"""CPU cost of charging one request to the client quotas (``ClientQuotas.record``), as
the Kafka listener does for every Produce, Fetch and (request_percentage) request, and
the gRPC listener for every Produce and Fetch (``broker/servicers/grpc_quotas.py``).

    .venv/bin/python bench/probes/quota_charge_micro.py [--calls 200000]

Prints µs per charge, best of 5, for: no quota configured (the usual case), a quota on
another user, and a quota on the caller.
"""

from __future__ import annotations

import argparse
import os
import timeit

from tidewater.broker.kafka.client_quotas import PRODUCER_BYTE_RATE, ClientQuotas, QuotaEntity
from tidewater.broker.servicers.grpc_quotas import GrpcQuotas
from tidewater.proto import tidewater_pb2 as pb

CASES = {
    "no quota configured": None,
    "a quota on another user": "bob",
    "a quota on the caller": "ANONYMOUS",
}


def us_per_charge(user: str | None, calls: int, request: pb.ProduceRequest) -> float:
    """Best of 5: µs per charge with a quota on ``user`` (None: no quota at all)."""
    quotas = ClientQuotas()
    if user is not None:
        quotas.set_quota(QuotaEntity(user=user), PRODUCER_BYTE_RATE, 1e12)
    now_ms = [0]
    charged = GrpcQuotas(lambda: quotas, clock_ms=lambda: now_ms[0])

    def charge() -> None:
        now_ms[0] += 1
        charged.charge_produce("ANONYMOUS", "", request)
    return min(timeit.repeat(charge, number=calls, repeat=5)) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    request = pb.ProduceRequest(partitions=[
        pb.ProducePartitionData(topic="t", partition=i, records=b"x" * 16384) for i in range(3)])
    print(f"load average {os.getloadavg()[0]:.2f}; {args.calls} charges per run, best of 5")
    print(f"{'case':<28} {'us/charge':>10}")
    for label, user in CASES.items():
        print(f"{label:<28} {us_per_charge(user, args.calls, request):>10.2f}")


if __name__ == "__main__":
    main()
