"""Raw Kafka protocol probes for tests that must not depend on a client library."""

from __future__ import annotations

import socket
import struct

PROBE_CORRELATION_ID = 4242


def plaintext_api_versions_answer(host: str, port: int, timeout_s: float = 5) -> bytes:
    """Whatever a listener sends back to a plaintext ApiVersions v0 (until it closes or
    ``timeout_s`` passes without a byte). A TLS listener answers no Kafka frame: check
    with ``answered_as_kafka``."""
    request = (struct.pack(">hhi", 18, 0, PROBE_CORRELATION_ID) + struct.pack(">h", 4)
               + b"kcat")
    answer = b""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(struct.pack(">i", len(request)) + request)
        try:
            while chunk := s.recv(4096):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return answer


def answered_as_kafka(answer: bytes) -> bool:
    """Does ``answer`` start like a Kafka response to the probe (its correlation id)?"""
    return struct.pack(">i", PROBE_CORRELATION_ID) in answer[:12]
