"""Tidewater controller."""

from tidewater.proto import grpc_env

grpc_env.apply()  # before any module of this package imports grpc (proto/grpc_env.py)
