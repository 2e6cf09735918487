"""tools/scrape.py: a /metrics answer cut short (its process killed mid-answer, as ``tide
chaos`` does) is one failed scrape, not a dead scraper (the chaos verdict failed on an
http.client.IncompleteRead that escaped ``scrape_one``)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from tidewater.tools.scrape import Scraper, ScrapeTarget, fetch_metrics


def _serve_cut_short(listener: socket.socket) -> None:
    """Answer one request with a Content-Length of 100 and 10 bytes, then close."""
    connection, _ = listener.accept()
    with connection:
        connection.recv(65536)
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                           b"Content-Length: 100\r\n\r\n# HELP x\n")


def _cut_short_url() -> str:
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: (_serve_cut_short(listener), listener.close()),
                     daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"


def test_an_answer_cut_short_raises_a_connection_error() -> None:
    with pytest.raises(ConnectionError, match="IncompleteRead"):
        fetch_metrics(_cut_short_url(), 5)


def test_the_scraper_records_it_as_a_failed_scrape_and_goes_on(tmp_path: Path) -> None:
    scraper = Scraper([ScrapeTarget("broker-1", _cut_short_url())], tmp_path, interval_ms=100,
                      timeout_ms=5000)
    try:
        (snapshot,) = scraper.scrape_round()
    finally:
        scraper.close()
    assert not snapshot.ok and "IncompleteRead" in snapshot.text
    assert scraper.errors == 1
    assert "error ConnectionError" in (tmp_path / "broker-1.prom").read_text()
