"""``tls_answer_write``'s pieces: the overlap of a server's and a reader's windows, the
in-memory TLS pair (a real TLS 1.3 handshake with the listener's context), and one
socket-BIO answer delivered whole (the retries on ``SSLWantRead/WriteError``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.probes import tls_answer_write as probe
from tidewater.proto.tls import server_ssl_context


def test_overlap_is_the_share_of_the_server_window() -> None:
    server = [(0.0, 1.0), (10.0, 12.0)]
    reader = [(0.5, 1.5), (13.0, 14.0)]  # half of the first window; none of the second
    first_byte_ms, server_ms, reader_ms, overlap = probe.overlaps(server, reader)
    assert overlap == pytest.approx(0.25)  # median of 0.5 and 0.0
    assert server_ms == pytest.approx(1500.0)
    assert reader_ms == pytest.approx(1000.0)
    assert first_byte_ms == pytest.approx(1750.0)


@pytest.mark.timeout(20)
def test_in_memory_pair_negotiates_tls13_and_counts_16_kib_records(tmp_path: Path) -> None:
    suite, encrypt_ms, decrypt_ms, records_per_mb = probe.in_memory(
        probe.write_files(tmp_path), megabytes=2)
    assert suite.startswith("TLSv1.3 ")
    assert records_per_mb == "61"  # 1 MB / 16 KiB records
    assert encrypt_ms > 0 and decrypt_ms > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["uvloop TLS", "socket-BIO TLS"])
def test_every_answer_arrives_whole(tmp_path: Path, path: str) -> None:
    files = probe.write_files(tmp_path)
    measured = uvloop.run(probe.measure(path, server_ssl_context(files), str(files.ca),
                                        2, tmp_path / "times.txt"))
    # the reader exits only after every byte of every answer; the windows pair up
    assert measured.mb_per_s > 0
    assert 0.0 <= measured.overlap <= 1.0
