"""The console's web application (Starlette): routes, the live fragments, admin actions.

Pages are rendered on the server from ``templates/``; parts that change by themselves
(the overview's broker table, the charts, a group's lag) are *fragments* at their own
URLs that ``static/console.js`` fetches again every few seconds and swaps in, so they
move without a reload (and the page still shows everything without script).

Admin actions (create and delete a topic, reset a group's offsets) exist only with
``allow_writes``. Each is a POST that first answers with a page saying what will be
done and asking to confirm; only the POST from that page (``confirm=yes``) acts. A POST
whose ``Origin`` is another site is refused (a page elsewhere cannot drive the console).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from tidewater.proto.errors import TidewaterError
from tidewater.tools.console import charts
from tidewater.tools.console.cluster_data import ClusterData, UnknownTopic
from tidewater.tools.console.metrics import CHARTS, LagHistory, MetricsHistory
from tidewater.tools.console.paging import PARTITIONS_PER_PAGE
from tidewater.tools.console.records import FORMATS, MODES, RecordPage, RecordQuery, RecordReader

HERE = Path(__file__).resolve().parent
LIVE_INTERVAL_MS = 2000
# Above this many partitions the record browser asks for a partition's number instead
# of listing them all: Chromium takes ~0.3 s to parse a list of 1,000 options.
MOST_PARTITION_OPTIONS = 100
# A topic config's source (cluster_data.ConfigRow.source) as the topic page words it.
CONFIG_SOURCE_LABELS = {
    "topic": "set on the topic", "dynamic broker": "this broker's dynamic config",
    "dynamic default": "every broker's dynamic default", "static broker": "broker setting (--set)",
    "default": "default", "default?": "default (no broker asked)"}


@dataclass
class ConsoleConfig:
    allow_writes: bool = False
    live_interval_ms: int = LIVE_INTERVAL_MS
    # HTTP Basic login: (user, password); None: no login (listen on 127.0.0.1 then).
    login: tuple[str, str] | None = None
    bootstrap: str = ""


def human_bytes(value: int | float | None) -> str:
    if value is None or value < 0:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def when(unix_ms: int | None) -> str:
    if unix_ms is None or unix_ms < 0:
        return "-"
    moment = datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{unix_ms % 1000:03d}Z"


def offset_cell(value: int | None) -> str:
    return "-" if value is None or value < 0 else str(value)


def parse_timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO date-time (UTC unless it says otherwise)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


class Console:
    """The application's state: the cluster door, the record reader, the metrics."""

    def __init__(self, data: ClusterData, records: RecordReader, metrics: MetricsHistory,
                 config: ConsoleConfig) -> None:
        self.data = data
        self.records = records
        self.metrics = metrics
        self.config = config
        self.lag = LagHistory()
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        env = self.templates.env
        env.filters["bytes"] = human_bytes
        env.filters["when"] = when
        env.filters["off"] = offset_cell
        env.filters["q"] = lambda s: quote(str(s), safe="")
        env.filters["rate"] = lambda v: "-" if v is None else charts.human(v)
        env.filters["bps"] = lambda v: "-" if v is None else human_bytes(v) + "/s"
        env.globals["allow_writes"] = config.allow_writes
        env.globals["live_ms"] = config.live_interval_ms
        env.globals["bootstrap"] = config.bootstrap
        env.globals["source_labels"] = CONFIG_SOURCE_LABELS

    def page(self, request: Request, name: str, context: dict[str, Any],
             status_code: int = 200) -> HTMLResponse:
        return self.templates.TemplateResponse(request, name, context, status_code=status_code)

    def error(self, request: Request, message: str, status_code: int = 503) -> HTMLResponse:
        return self.page(request, "error.html", {"title": "Error", "message": message},
                         status_code=status_code)

    # ------------------------------------------------------------------ pages

    async def overview(self, request: Request) -> Response:
        o = await run_in_threadpool(self.data.overview)
        return self.page(request, "overview.html", {"title": "Overview", "o": o,
                                                     "metrics": self.metrics.status()})

    async def brokers_fragment(self, request: Request) -> Response:
        o = await run_in_threadpool(self.data.overview)
        return self.page(request, "_brokers.html", {"o": o, "metrics": self.metrics.status()})

    async def topics(self, request: Request) -> Response:
        rows = await run_in_threadpool(self.data.topics)
        return self.page(request, "topics.html", {"title": "Topics", "rows": rows,
                                                   "rates": self.metrics.topic_rates()})

    async def topic(self, request: Request) -> Response:
        name = request.path_params["name"]
        params = request.query_params
        page_index, per_page = _page_asked(request)
        # Reading a partition's records without a page asked: the page holding it.
        showing = int(params["partition"]) if params.get("partition", "").isdigit() else None
        form = {"partition": params.get("partition", "0"), "mode": params.get("mode", "newest"),
                "limit": params.get("limit", "20"), "offset": params.get("offset", "0"),
                "timestamp": params.get("timestamp", ""), "key": params.get("key", ""),
                "format": params.get("format", "text")}
        reading = None
        browse_error = ""
        if "mode" in params:
            try:
                query = RecordQuery(
                    partition=int(form["partition"]), mode=form["mode"], limit=int(form["limit"]),
                    offset=int(form["offset"] or 0),
                    timestamp_ms=(parse_timestamp_ms(form["timestamp"])
                                  if form["mode"] == "timestamp" else 0),
                    key=form["key"] or None, fmt=form["format"])
            except ValueError as e:
                browse_error = str(e) or type(e).__name__
            else:  # read while the topic is described: the page waits for the slower
                reading = asyncio.ensure_future(self._read_records(name, query))
        page = None
        try:
            detail = await run_in_threadpool(self.data.topic, name, page_index, per_page,
                                             showing)
        except UnknownTopic:
            return self.error(request, f"no topic {name!r}", 404)
        finally:  # never left running unawaited, whatever the description raised
            if reading is not None:
                page, browse_error = await reading
        return self.page(request, "topic.html", {
            "title": f"Topic {name}", "t": detail, "rate": self.metrics.topic_rates().get(name),
            "form": form, "page": page, "default_per_page": PARTITIONS_PER_PAGE,
            "most_partition_options": MOST_PARTITION_OPTIONS,
            "keep_q": _pager_query(request),
            "browse_error": browse_error, "modes": MODES, "formats": FORMATS})

    async def _read_records(self, topic: str, query: RecordQuery) -> tuple[RecordPage | None, str]:
        """The record browser's page, or why there is none."""
        try:
            return await run_in_threadpool(self.records.read, topic, query), ""
        except (ValueError, LookupError, TidewaterError) as e:
            return None, str(e) or type(e).__name__

    async def record(self, request: Request) -> Response:
        name = request.path_params["name"]
        partition = int(request.path_params["partition"])
        offset = int(request.path_params["offset"])
        fmt = request.query_params.get("format", "text")
        if fmt not in FORMATS:
            return self.error(request, f"format must be one of {', '.join(FORMATS)}", 400)
        r = await run_in_threadpool(self.records.one, name, partition, offset, fmt)
        if r is None:
            return self.error(request, f"{name}-{partition} holds no record at {offset}", 404)
        return self.page(request, "record.html", {"title": f"{name}-{partition}@{offset}",
                                                   "topic": name, "partition": partition,
                                                   "r": r, "format": fmt, "formats": FORMATS})

    async def transactions(self, request: Request) -> Response:
        t = await run_in_threadpool(self.data.transactions)
        return self.page(request, "transactions.html", {"title": "Transactions", "t": t})

    async def quotas(self, request: Request) -> Response:
        q = await run_in_threadpool(self.data.quotas)
        return self.page(request, "quotas.html", {"title": "Client quotas", "q": q})

    async def groups(self, request: Request) -> Response:
        rows = await run_in_threadpool(self.data.groups)
        return self.page(request, "groups.html", {"title": "Consumer groups", "rows": rows})

    async def group(self, request: Request) -> Response:
        return await self._group(request, "group.html")

    async def group_lag_fragment(self, request: Request) -> Response:
        # The live part of the group page, asked with the page's own page and per_page.
        return await self._group(request, "_group_lag.html")

    async def _group(self, request: Request, template: str) -> Response:
        group_id = request.path_params["group_id"]
        g = await run_in_threadpool(self.data.group, group_id, *_page_asked(request),
                                    *_page_asked(request, "mpage", "members_per_page"))
        self.lag.add(group_id, int(time.time() * 1000), g.total_lag)
        return self.page(request, template, {"title": f"Group {group_id}", "g": g,
                                             "keep_q": _pager_query(request),
                                             "keep_members_q": _pager_query(request, "mpage"),
                                             "keep_live_q": _pager_query(request, "page",
                                                                         "mpage"),
                                             "lag_chart": self._lag_chart(group_id)})

    def _lag_chart(self, group_id: str) -> str:
        series = {"lag": self.lag.series(group_id)}
        now_ms = int(time.time() * 1000)
        return charts.line_chart("Total lag (records)", series, now_ms=now_ms,
                                 window_s=charts.window_for(series, now_ms), chart_id="lag-chart")

    async def charts_page(self, request: Request) -> Response:
        return self.page(request, "charts.html", {"title": "Charts", "svgs": self._charts()})

    async def charts_fragment(self, request: Request) -> Response:
        return self.page(request, "_charts.html", {"svgs": self._charts()})

    def _charts(self) -> list[str]:
        if not self.metrics.targets:
            return []
        now_ms = int(time.time() * 1000)
        all_series = {key: self.metrics.series(key) for key in CHARTS}
        window_s = charts.window_for(all_series["requests"], now_ms,
                                     most_s=self.metrics.history_s)
        return [charts.line_chart(title, all_series[key], now_ms=now_ms, window_s=window_s,
                                  chart_id=f"chart-{key}")
                for key, title in CHARTS.items()]

    async def audit_report(self, request: Request) -> Response:
        summary = self.data.audit()
        if summary is None or summary.report_html is None:
            return self.error(request, "no audit report (tide console --audit-dir DIR)", 404)
        return FileResponse(summary.report_html, media_type="text/html")

    async def healthz(self, request: Request) -> Response:
        return Response("ok\n", media_type="text/plain")

    # ------------------------------------------------------------------ admin actions

    async def action(self, request: Request) -> Response:
        if not self.config.allow_writes:
            return self.error(request, "this console is read-only (tide console --allow-writes)",
                              403)
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.headers.get("host"):
            return self.error(request, "refused: the form came from another site", 403)
        kind = request.path_params["kind"]
        # The forms are urlencoded (no file uploads): parsed here, no multipart parser.
        body = (await request.body()).decode("utf-8", errors="replace")
        form = dict(parse_qsl(body, keep_blank_values=True))
        fields = {k: str(v) for k, v in form.items() if k != "confirm"}
        described = self._describe_action(kind, fields)
        if described is None:
            return self.error(request, f"unknown action {kind!r}", 404)
        if form.get("confirm") != "yes":
            return self.page(request, "confirm.html", {"title": "Confirm", "kind": kind,
                                                        "what": described, "fields": fields})
        try:
            where = await run_in_threadpool(self._do_action, kind, fields)
        except (TidewaterError, ValueError) as e:
            return self.error(request, f"{described}: failed: {e}", 400)
        return RedirectResponse(where, status_code=303)

    @staticmethod
    def _describe_action(kind: str, f: dict[str, str]) -> str | None:
        if kind == "create-topic":
            return (f"Create topic {f.get('name', '')!r} with {f.get('partitions', '?')} "
                    f"partition(s), replication factor {f.get('replication_factor', '?')}")
        if kind == "delete-topic":
            return f"Delete topic {f.get('name', '')!r} and every record in it"
        if kind == "reset-offsets":
            to = f.get("to", "")
            target = f"offset {f.get('offset', '')}" if to == "offset" else to
            return (f"Reset the committed offsets of group {f.get('group', '')!r} on topic "
                    f"{f.get('topic', '')!r} to {target}")
        return None

    def _do_action(self, kind: str, f: dict[str, str]) -> str:
        if kind == "create-topic":
            configs = {}
            for line in f.get("configs", "").splitlines():
                if line.strip():
                    name, sep, value = line.partition("=")
                    if not sep:
                        raise ValueError(f"bad config {line!r}: expected NAME=VALUE")
                    configs[name.strip()] = value.strip()
            self.data.create_topic(f["name"].strip(), int(f.get("partitions") or -1),
                                   int(f.get("replication_factor") or -1), configs)
            return f"/topics/{quote(f['name'].strip(), safe='')}"
        if kind == "delete-topic":
            self.data.delete_topic(f["name"])
            return "/topics"
        if kind == "reset-offsets":
            to = f.get("to", "")
            if to not in ("earliest", "latest", "offset"):
                raise ValueError("reset to earliest, latest or an offset")
            offset = int(f["offset"]) if to == "offset" else None
            self.data.reset_offsets(f["group"], f["topic"], to, offset)
            return f"/groups/{quote(f['group'], safe='')}"
        raise ValueError(f"unknown action {kind!r}")


def _page_asked(request: Request, page: str = "page", per_page: str = "per_page"
                ) -> tuple[int | None, int | None]:
    """A paged table's page (0-based) and page size query parameters, if given."""
    params = request.query_params
    return (int(params[page]) if params.get(page) else None,
            int(params[per_page]) if params.get(per_page) else None)


def _pager_query(request: Request, *pages: str) -> str:
    """The query string a pager's links keep: all but ``pages`` (its own page, by default
    ``page``): a page size, the record browser's fields, the other table's page; each
    parameter followed by ``&``."""
    dropped = pages or ("page",)
    return "".join(f"{quote(k, safe='')}={quote(v, safe='')}&"
                   for k, v in request.query_params.multi_items() if k not in dropped)


def _guarded(console: Console, handler: Callable[[Request], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]:
    """The handler, with the cluster's errors shown as a page (503) instead of a trace."""
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except TidewaterError as e:
            return console.error(request, f"the cluster did not answer: {e}")
        except ValueError as e:
            return console.error(request, str(e), 400)
    return run


class BasicAuth:
    """HTTP Basic login (ASGI middleware): every request but /healthz needs it."""

    def __init__(self, app: Any, user: str, password: str) -> None:
        self.app = app
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") != "/healthz":
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not hmac.compare_digest(given, self.expected):
                response = Response("login required\n", status_code=401, media_type="text/plain",
                                    headers={"WWW-Authenticate": 'Basic realm="tide console"'})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(console: Console) -> Any:
    g = console
    routes = [
        Route("/", _guarded(g, g.overview)),
        Route("/fragments/brokers", _guarded(g, g.brokers_fragment)),
        Route("/fragments/charts", _guarded(g, g.charts_fragment)),
        Route("/topics", _guarded(g, g.topics)),
        Route("/topics/{name}", _guarded(g, g.topic)),
        Route("/topics/{name}/records/{partition:int}/{offset:int}", _guarded(g, g.record)),
        Route("/groups", _guarded(g, g.groups)),
        Route("/groups/{group_id:path}/lag", _guarded(g, g.group_lag_fragment)),
        Route("/groups/{group_id:path}", _guarded(g, g.group)),
        Route("/transactions", _guarded(g, g.transactions)),
        Route("/quotas", _guarded(g, g.quotas)),
        Route("/charts", _guarded(g, g.charts_page)),
        Route("/audit/report.html", g.audit_report),
        Route("/healthz", g.healthz),
        Route("/actions/{kind}", _guarded(g, g.action), methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]

    app: Any = Starlette(routes=routes)
    if console.config.login is not None:
        app = BasicAuth(app, *console.config.login)
    return app
