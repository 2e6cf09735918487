"""Metrics scraper: poll every process's Prometheus ``/metrics`` and keep a history.

Used by ``tide metrics scrape`` and by ``tide chaos`` (which runs it during a
run); the audit job reads the files it writes.

Output folder layout::

    OUT/<source>.prom     snapshots of one source, appended in time order
    OUT/sources.json      {"<source>": {"url": "http://host:port/metrics"}, ...}

``<source>`` is the process name: ``controller``, ``broker-1``, ``broker-2``,
... (from ``tide cluster`` / docker-compose), or ``NAME`` given as
``NAME=host:port`` in ``--targets``, or ``host_port`` for a bare
``host:port``. A broker's id is the number after ``broker-``.

File format (UTF-8 text, one file per source). Each scrape appends one block::

    # SCRAPE <unix_ms> <source> ok
    <the Prometheus text exposition exactly as served, every line>
    # EOF

or, when the source did not answer (process down, paused, cut off)::

    # SCRAPE <unix_ms> <source> error <one-line reason>

``<unix_ms>`` is the wall-clock time (ms since the epoch) at which the scrape
started. Blocks are written with one ``write`` and flushed, so only the last
block of a file can be torn (scraper killed mid-write): an ``ok`` block
without its ``# EOF`` line is incomplete and must be ignored. Because the
markers are ``#`` comments, each block is also valid Prometheus text on its
own; split on ``# SCRAPE`` lines to get the snapshots. Samples carry no
timestamps of their own: the block's ``<unix_ms>`` is their time.

``read_snapshots(path)`` parses a file back into ``Snapshot`` objects.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

SCRAPE_MARKER = "# SCRAPE "
END_MARKER = "# EOF"
SOURCES_FILE = "sources.json"
SCRAPE_TIMEOUT_MS_MAX = 5000


class ScrapeConfigError(ValueError):
    """A target specification that cannot be used (bad host:port, duplicate name)."""


@dataclass(frozen=True, slots=True)
class ScrapeCredentials:
    """Who a scraper is to a secured /metrics (broker/security/metrics_http.py): a client
    certificate of the cluster's CA (HTTPS) and/or a cluster user's password (HTTP Basic)."""

    certfile: str | None = None
    keyfile: str | None = None
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_security(cls, security: Mapping[str, object]) -> ScrapeCredentials | None:
        """From the clients' security options (``SecurityOptions``: ``ssl_certfile``,
        ``ssl_keyfile``, ``sasl_plain_username``, ``sasl_plain_password``); None if none."""
        def text(key: str) -> str | None:
            value = security.get(key)
            return value if isinstance(value, str) and value else None
        credentials = cls(text("ssl_certfile"), text("ssl_keyfile"),
                          text("sasl_plain_username"), text("sasl_plain_password"))
        return None if credentials == cls() else credentials


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    source: str  # file stem: controller, broker-1, ...
    url: str  # http://host:port/metrics, or https:// (a process with TLS)
    cafile: str | None = None  # an https target's CA (None: the system's)
    credentials: ScrapeCredentials | None = None  # secure mode: a certificate, a password


@dataclass(frozen=True, slots=True)
class Snapshot:
    unix_ms: int
    source: str
    ok: bool
    text: str  # the exposition (ok) or the reason (error)


def target_for(source: str, host_port: str, *, https: bool = False,
               cafile: str | None = None,
               credentials: ScrapeCredentials | None = None) -> ScrapeTarget:
    """A target for ``host:port`` (an http(s) URL is accepted as is); ``https``: the
    process serves /metrics over TLS (a broker with TLS), checked against ``cafile``;
    ``credentials``: what a secured /metrics asks for."""
    if host_port.startswith(("http://", "https://")):
        return ScrapeTarget(source, host_port, cafile, credentials)
    host, sep, port = host_port.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ScrapeConfigError(f"bad metrics target {host_port!r}: expected HOST:PORT")
    scheme = "https" if https else "http"
    return ScrapeTarget(source, f"{scheme}://{host}:{int(port)}/metrics", cafile, credentials)


def parse_targets(spec: str, *, cafile: str | None = None,
                  credentials: ScrapeCredentials | None = None) -> list[ScrapeTarget]:
    """Targets from ``host:port,NAME=host:port,...`` (``https://...`` URLs checked against
    ``cafile``; ``credentials`` shown to each)."""
    targets = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, eq, address = item.partition("=")
        if not eq:
            address = name
            name = name.replace(":", "_").replace("/", "_")
        targets.append(target_for(name, address, cafile=cafile, credentials=credentials))
    if not targets:
        raise ScrapeConfigError("no metrics targets given")
    _check_unique(targets)
    return targets


def _check_unique(targets: Iterable[ScrapeTarget]) -> None:
    seen = set()
    for t in targets:
        if t.source in seen:
            raise ScrapeConfigError(f"two metrics targets named {t.source!r}")
        seen.add(t.source)


def fetch_metrics(url: str, timeout_s: float, cafile: str | None = None,
                  credentials: ScrapeCredentials | None = None) -> str:
    """The exposition text at ``url`` (https: verified against ``cafile``, showing
    ``credentials``' client certificate; their password as HTTP Basic); raises OSError
    (incl. URLError and ssl.SSLError) on failure. An answer cut short or garbled (the
    process killed mid-answer, as ``tide chaos`` does) is a ConnectionError too: http.client
    raises its own IncompleteRead, which is not an OSError."""
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=cafile)
        if credentials is not None and credentials.certfile:
            context.load_cert_chain(credentials.certfile, credentials.keyfile)
    request = urllib.request.Request(url)
    if credentials is not None and credentials.username:
        token = base64.b64encode(
            f"{credentials.username}:{credentials.password or ''}".encode()).decode("ascii")
        request.add_header("Authorization", f"Basic {token}")
    # The targets are http(s) URLs only (ScrapeTarget builds or accepts no other scheme).
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            body: bytes = response.read()
    except http.client.HTTPException as e:
        raise ConnectionError(f"{type(e).__name__}: {e!r}") from e
    return body.decode("utf-8")


def format_block(snapshot: Snapshot) -> str:
    header = f"{SCRAPE_MARKER}{snapshot.unix_ms} {snapshot.source}"
    if not snapshot.ok:
        reason = " ".join(snapshot.text.split()) or "unknown"
        return f"{header} error {reason}\n"
    body = snapshot.text if snapshot.text.endswith("\n") or not snapshot.text else snapshot.text + "\n"
    return f"{header} ok\n{body}{END_MARKER}\n"


def read_snapshots(path: Path) -> Iterator[Snapshot]:
    """Parse one ``<source>.prom`` file; a torn last block is skipped."""
    current: Snapshot | None = None
    body: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith(SCRAPE_MARKER):
                current = None  # an ok block without # EOF is torn: drop it
                fields = line[len(SCRAPE_MARKER):].rstrip("\n").split(" ", 3)
                if len(fields) < 3 or not fields[0].isdigit():
                    continue
                unix_ms, source, status = int(fields[0]), fields[1], fields[2]
                if status == "ok":
                    current, body = Snapshot(unix_ms, source, True, ""), []
                else:
                    yield Snapshot(unix_ms, source, False, fields[3] if len(fields) > 3 else "")
            elif current is not None:
                if line.rstrip("\n") == END_MARKER:
                    yield Snapshot(current.unix_ms, current.source, True, "".join(body))
                    current = None
                else:
                    body.append(line)


def parse_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of an exposition: name -> [(labels, value)]. Small helper for tests and chaos."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return samples


class Scraper:
    """Scrapes every target each ``interval_ms`` and appends to ``out_dir``.

    Rounds run at a fixed rate; a round that overruns skips the ticks it
    missed rather than bunching scrapes. Each target is scraped in its own
    worker thread so a hung process delays nobody else.
    """

    def __init__(self, targets: list[ScrapeTarget], out_dir: Path, *, interval_ms: int,
                 timeout_ms: int | None = None):
        if interval_ms <= 0:
            raise ScrapeConfigError(f"--interval-ms must be positive, got {interval_ms}")
        if not targets:
            raise ScrapeConfigError("no metrics targets")
        _check_unique(targets)
        self.targets = list(targets)
        self.out_dir = Path(out_dir)
        self.interval_ms = interval_ms
        self.timeout_ms = timeout_ms or min(max(interval_ms, 500), SCRAPE_TIMEOUT_MS_MAX)
        self.rounds = 0
        self.errors = 0
        self._stop = threading.Event()
        self._files: dict[str, TextIO] = {}
        self._pool = ThreadPoolExecutor(max_workers=len(self.targets),
                                        thread_name_prefix="scrape")

    def open(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        index_path = self.out_dir / SOURCES_FILE
        index = json.loads(index_path.read_text()) if index_path.exists() else {}
        for t in self.targets:
            index[t.source] = {"url": t.url}
            if t.source not in self._files:
                self._files[t.source] = open(self.out_dir / f"{t.source}.prom", "a",
                                             encoding="utf-8")
        index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for f in self._files.values():
            f.close()
        self._files.clear()

    def stop(self) -> None:
        """Ask ``run`` to return after the current round (thread-safe)."""
        self._stop.set()

    def scrape_one(self, target: ScrapeTarget) -> Snapshot:
        unix_ms = int(time.time() * 1000)
        try:
            text = fetch_metrics(target.url, self.timeout_ms / 1000, target.cafile,
                                 target.credentials)
        except (OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            return Snapshot(unix_ms, target.source, False, f"{type(e).__name__}: {reason}")
        return Snapshot(unix_ms, target.source, True, text)

    def scrape_round(self) -> list[Snapshot]:
        """Scrape every target once and append the blocks; returns the snapshots."""
        if not self._files:
            self.open()
        snapshots = list(self._pool.map(self.scrape_one, self.targets))
        for snap in snapshots:
            f = self._files[snap.source]
            f.write(format_block(snap))
            f.flush()
            self.errors += not snap.ok
        self.rounds += 1
        return snapshots

    def run(self, duration_s: float | None = None) -> None:
        """Scrape until ``stop()`` or ``duration_s`` elapsed (None: forever)."""
        self.open()
        start = time.monotonic()
        deadline = None if duration_s is None else start + duration_s
        tick = 0
        while not self._stop.is_set():
            self.scrape_round()
            now = time.monotonic()
            # Next tick on the fixed grid, skipping ticks already missed.
            tick = max(tick + 1, int((now - start) * 1000 // self.interval_ms) + 1)
            next_at = start + tick * self.interval_ms / 1000
            if deadline is not None and next_at >= deadline:
                break
            self._stop.wait(max(0.0, next_at - time.monotonic()))


class BackgroundScraper:
    """A Scraper on a daemon thread, for ``tide chaos``: ``start()`` ... ``stop()``."""

    def __init__(self, scraper: Scraper):
        self.scraper = scraper
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)
        self.failure: BaseException | None = None

    def _run(self) -> None:
        try:
            self.scraper.run()
        except BaseException as e:  # reported by stop(); a dead scraper must not pass silently
            self.failure = e

    def start(self) -> None:
        self.scraper.open()
        self._thread.start()

    def stop(self) -> None:
        self.scraper.stop()
        self._thread.join(timeout=30)
        self.scraper.close()
        if self.failure is not None:
            raise RuntimeError(f"metrics scraper failed: {self.failure!r}") from self.failure
