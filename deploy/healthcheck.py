#!/opt/tidewater/bin/python
"""Container health check: exit 0 only when the local process answers gRPC.

Usage: tidewater-healthcheck broker|controller [PORT]

A broker must answer ``Broker.Metadata``, the controller
``Controller.DescribeCluster``, with gRPC status OK within the timeout. A port
that accepts connections but does not serve fails: that is the point.
"""

from __future__ import annotations

import sys

import grpc

from proto import tidewater_pb2 as pb
from proto import tidewater_pb2_grpc as pb_grpc

TIMEOUT_S = 3.0
DEFAULT_PORTS = {"broker": 9092, "controller": 9090}


def check(role: str, port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        if role == "broker":
            pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=TIMEOUT_S)
        else:
            pb_grpc.ControllerStub(channel).DescribeCluster(
                pb.DescribeClusterRequest(), timeout=TIMEOUT_S
            )


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in DEFAULT_PORTS:
        print("usage: tidewater-healthcheck broker|controller [PORT]", file=sys.stderr)
        return 2
    role = argv[0]
    port = int(argv[1]) if len(argv) > 1 else DEFAULT_PORTS[role]
    try:
        check(role, port)
    except grpc.RpcError as e:
        print(f"unhealthy: {role} on port {port}: {e.code().name}", file=sys.stderr)
        return 1
    print(f"healthy: {role} on port {port}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
