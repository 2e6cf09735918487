"""Tidewater clients: Producer, AsyncProducer, Consumer, admin and the tide CLI.

Importing the library changes nothing process-wide. A program may run its clients
with the gRPC settings of Tidewater's own programs (``tide``, the brokers, the
demo, the benchmarks) by calling ``proto.grpc_env.apply()`` before it first
imports ``grpc`` (see proto/grpc_env.py).
"""
