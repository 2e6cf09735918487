"""Test-wide set-up: the gRPC settings every Tidewater process makes (proto/grpc_env.py),
applied before any test module or fixture imports grpc, so in-process clients run as
users' do."""

from tidewater.proto import grpc_env

grpc_env.apply()
