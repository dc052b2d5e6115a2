"""``agentrl view``'s web server (aiohttp): one page, its packaged static files, and a small JSON API over one run
directory (or one trajectories file).

Routes (GET only): ``/`` the page; ``/static/<name>`` the files of ``agentrl/viewer/static`` (a fixed table read at
start, so no request path ever reaches the filesystem); ``/api/run`` what was found; ``/api/metrics?keys=a,b`` curve
columns of ``metrics.jsonl``; ``/api/list?<filters>&offset=&limit=`` a page of the trajectory list;
``/api/trajectory?row=N``; ``/api/group?row=N`` the rows of N's group; ``/api/diff?a=N&b=M``.

Security model (trajectory text is model output; treat it as hostile):

- binds 127.0.0.1 by default; a request whose ``Host`` is not an allowed name on the bound port is refused (421), so
  a web page that rebinds its DNS name to 127.0.0.1 cannot read the API (:mod:`agentrl.gateway.guard`, shared with
  the gateway: the loopback names and the bound address by default, any name for a wildcard bind, or the names
  given); a connection that sends no complete request header within ``idle_timeout_s`` is closed;
- serves the run directory's known files only (``metrics.jsonl``, ``trajectories.jsonl``,
  ``trainer_logprobs.jsonl``, ``summary.json``), each checked to be a regular file whose real path is inside the
  directory (a link leading outside is refused and reported); rows are addressed by number, never by a path, and
  no trajectory field is ever used as a path;
- every response carries a Content-Security-Policy allowing scripts and styles from this origin only (no inline
  script, no ``data:``/external origins), ``connect-src 'self'``, no frames, plus ``nosniff`` and
  ``no-referrer``; the page builds its DOM with ``textContent`` only;
- nothing is fetched from or sent to anywhere else: the page has no external asset;
- the page shows bidi control characters (U+202E and the like, which can make ``safe\u202eexe.txt`` read as
  "safetxt.exe") as visible ``⟨U+202E⟩`` marks; a lone surrogate in a file (``\udcff``) is sent as its JSON
  escape; numbers beyond the index's 64-bit columns count as missing, never as an error.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import json
import logging
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrl.controller.runlog import TRAINER_LOGPROBS, TRAJECTORIES
from agentrl.gateway.guard import app_runner
from agentrl.netguard import HostCheck, default_hosts
from agentrl.viewer.data import (
    TERMINATIONS, Filter, LogprobIndex, MetricsFile, TrajectoryIndex, UnsafePath, open_nofollow, safe_file,
)
from agentrl.viewer.render import diff_marks, trajectory_view
from agentrl.viewer.tokens import TokenDecoder, find_tokenizer

log = logging.getLogger("agentrl.viewer")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
MAX_PAGE = 500
SUMMARY_MAX_BYTES = 1 << 20
HOSTS = web.AppKey("allowed_hosts", dict)  # {"check": the HostCheck of the bound port (None before start: any)}
IDLE_TIMEOUT_S = 15.0
DEFAULT_METRICS = ("reward", "train/loss", "train/staleness/mean", "train/staleness/max", "eval/reward")


def load_static() -> dict[str, tuple[bytes, str]]:
    """The packaged static files: ``{name: (bytes, content type)}``."""
    out = {}
    for f in importlib.resources.files("agentrl.viewer").joinpath("static").iterdir():
        suffix = "." + f.name.rsplit(".", 1)[-1]
        if f.is_file() and suffix in _TYPES:
            out[f.name] = (f.read_bytes(), _TYPES[suffix])
    return out


class RunData:
    """The files one viewer serves: a run directory's known files, or a single trajectories file."""

    def __init__(self, path: str | Path, tokenizer: str | Path | None = None):
        p = Path(path).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        self.notes: list[str] = []
        self.single_file = p.is_file()
        self.root = p.resolve().parent if self.single_file else p.resolve()
        self.name = p.name
        self._names = {"trajectories": p.name} if self.single_file else {
            "trajectories": TRAJECTORIES, "logprobs": TRAINER_LOGPROBS, "metrics": "metrics.jsonl",
            "summary": "summary.json"}
        self.files: dict[str, str] = {}
        self.trajectories: TrajectoryIndex | None = None
        self.logprobs: LogprobIndex | None = None
        self.metrics: MetricsFile | None = None
        self.summary: Any = None
        self._discover()
        self.decoder: TokenDecoder | None = None
        tok_path = Path(tokenizer).expanduser() if tokenizer else None
        if tok_path is None:
            tok_path = find_tokenizer(self.root)
        if tok_path is not None:
            try:
                self.decoder = TokenDecoder.from_path(tok_path)
            except (OSError, ValueError) as e:
                self.notes.append(f"tokenizer not loaded: {e}")
        if self.decoder is None:
            self.notes.append("no tokenizer: tokens show as ids (pass --tokenizer DIR)")
        self.notes = [n for n in self.notes if n]
        self.lock = asyncio.Lock()  # held while the index is refreshed or read (see agentrl.viewer.data)
        self._queries: OrderedDict[tuple, list[int]] = OrderedDict()
        self.background: asyncio.Future | None = None

    def _discover(self) -> None:
        """Finds the known files not found yet (a run that is starting writes them later)."""
        kinds = {"trajectories": TrajectoryIndex, "logprobs": LogprobIndex, "metrics": MetricsFile}
        for key, name in self._names.items():
            if key in self.files:
                continue
            try:
                f = safe_file(self.root, name)
            except UnsafePath as e:
                note = f"ignored {e}"
                if note not in self.notes:
                    self.notes.append(note)
                continue
            if f is None:
                continue
            self.files[key] = f.name
            if key == "summary":
                try:
                    with open_nofollow(f) as fh:
                        self.summary = json.loads(fh.read(SUMMARY_MAX_BYTES))
                except (OSError, ValueError) as e:
                    self.notes.append(f"summary.json unreadable: {e}")
            else:
                setattr(self, key, kinds[key](f))

    async def refresh(self) -> None:
        """Indexes what was appended to the files since the last call (and picks up files that appeared), in a
        thread. Callers hold ``lock``."""
        self._discover()
        for f in (self.trajectories, self.logprobs, self.metrics):
            if f is not None:
                await asyncio.to_thread(f.refresh)

    def problems(self) -> dict[str, Any]:
        out = {}
        for key, f in (("trajectories", self.trajectories), ("logprobs", self.logprobs), ("metrics", self.metrics)):
            if f is not None:
                out[self.files[key]] = f.problems.to_json()
        return out

    def query(self, flt: Filter) -> list[int]:
        assert self.trajectories is not None
        key = (flt, self.trajectories.version)
        rows = self._queries.get(key)
        if rows is None:
            rows = self.trajectories.query(flt)
            self._queries[key] = rows
            while len(self._queries) > 16:
                self._queries.popitem(last=False)
        return rows

    def locate(self, row: int) -> tuple[Any, ...]:
        """Where row ``row`` and its trainer record are (read under ``lock``; :meth:`view` reads them later)."""
        idx = self.trajectories
        assert idx is not None
        tid = idx.ids[row]
        lp_loc = self.logprobs.where.get(tid) if (self.logprobs is not None and tid) else None
        return idx.locate(row), lp_loc, idx.row(row)

    def view(self, loc: tuple[Any, ...]) -> dict[str, Any]:
        """The page's view of a located row (reads and parses its lines; no index access, so no lock)."""
        assert self.trajectories is not None
        tloc, lp_loc, row = loc
        traj, meta = self.trajectories.read_record(tloc)
        trainer = self.logprobs.read(lp_loc) if (self.logprobs is not None and lp_loc) else None
        return trajectory_view(traj, meta, self.decoder, trainer, row)


def _sanitize(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _sanitize(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_sanitize(v) for v in x]
    return x


def _json(obj: Any, status: int = 200) -> web.Response:
    try:
        body = json.dumps(obj, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except ValueError:
        body = json.dumps(_sanitize(obj), allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    # A lone surrogate (a "\udcff" escape in a file) cannot be UTF-8: it only occurs inside a JSON string, where
    # backslashreplace writes exactly its JSON escape.
    return web.Response(body=body.encode("utf-8", "backslashreplace"), status=status,
                        content_type="application/json", charset="utf-8")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _int_param(request: web.Request, name: str, default: int | None = None, lo: int = 0,
               hi: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"{name}: required")
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw[:40]!r}") from None
    if v < lo or (hi is not None and v > hi):
        raise ValueError(f"{name}: {v} is out of range")
    return v


def make_app(data: RunData, *, static: dict[str, tuple[bytes, str]] | None = None) -> web.Application:
    """The aiohttp application over ``data``. ``app[HOSTS]["check"]``, which ``Host`` values are accepted, is set
    by :func:`start` once the port is known."""
    static = static if static is not None else load_static()

    @web.middleware
    async def security(request: web.Request, handler: Any) -> web.StreamResponse:
        check = request.app[HOSTS]["check"]
        if check is not None and not check.allows(request.headers.get("Host")):
            resp: web.StreamResponse = _error(421, "unexpected Host header")
        else:
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                resp = _error(e.status, e.reason)
            except Exception:  # never a traceback in the page; the server's log has it
                log.exception("viewer: %s failed", request.path_qs)
                resp = _error(500, "internal error (see the server's log)")
        resp.headers.update(SECURITY_HEADERS)
        return resp

    app = web.Application(middlewares=[security])
    app[HOSTS] = {"check": None}

    async def index(request: web.Request) -> web.Response:
        body, ctype = static["index.html"]
        return web.Response(body=body, content_type=ctype, charset="utf-8")

    async def static_file(request: web.Request) -> web.Response:
        item = static.get(request.match_info["name"])
        if item is None:
            return _error(404, "not found")
        return web.Response(body=item[0], content_type=item[1], charset="utf-8" if item[1] != "image/svg+xml" else None)

    async def api_run(request: web.Request) -> web.Response:
        async with data.lock:
            await data.refresh()
            return _run_info()

    def _run_info() -> web.Response:
        idx = data.trajectories
        return _json({
            "name": data.name, "root": str(data.root), "files": data.files,
            "notes": data.notes + ([f"no {TRAJECTORIES} in {data.root} (yet)"] if idx is None else []),
            "rows": len(idx) if idx is not None else 0,
            "envs": sorted(set(idx.envs))[:1000] if idx is not None else [],
            "terminations": list(TERMINATIONS),
            "metric_keys": list(data.metrics.keys) if data.metrics is not None else [],
            "default_metrics": [k for k in DEFAULT_METRICS if data.metrics is not None and k in data.metrics.keys],
            "summary": _sanitize(data.summary) if isinstance(data.summary, dict) else None,
            "tokenizer": data.decoder.source if data.decoder is not None else None,
            "problems": data.problems(),
        })

    async def api_metrics(request: web.Request) -> web.Response:
        if data.metrics is None:
            return _json({"columns": {"step": []}, "problems": None})
        keys = [k for k in request.query.get("keys", "").split(",") if k][:50]
        async with data.lock:
            await data.refresh()
            return _json({"columns": data.metrics.columns(keys), "problems": data.metrics.problems.to_json()})

    def _need_rows() -> TrajectoryIndex:
        if data.trajectories is None:
            raise web.HTTPNotFound(reason="this directory has no trajectories file")
        return data.trajectories

    async def api_list(request: web.Request) -> web.Response:
        idx = _need_rows()
        try:
            flt = Filter.from_query(dict(request.query))
            offset = _int_param(request, "offset", 0)
            limit = _int_param(request, "limit", 100, lo=1, hi=MAX_PAGE)
        except ValueError as e:
            return _error(400, str(e))
        async with data.lock:
            await data.refresh()
            rows = await asyncio.to_thread(data.query, flt)
            page = [idx.row(i) for i in rows[offset: offset + limit]]
            return _json({"total": len(rows), "offset": offset, "rows": page, "indexed": len(idx),
                          "problems": idx.problems.to_json()})

    def _row(request: web.Request, name: str) -> int:
        idx = _need_rows()
        try:
            return _int_param(request, name, hi=len(idx) - 1)
        except ValueError as e:
            raise web.HTTPBadRequest(reason=str(e)) from None

    async def api_trajectory(request: web.Request) -> web.Response:
        async with data.lock:
            await data.refresh()
            loc = data.locate(_row(request, "row"))
        try:
            return _json(await asyncio.to_thread(data.view, loc))
        except (OSError, ValueError) as e:
            return _error(422, str(e))

    async def api_group(request: web.Request) -> web.Response:
        async with data.lock:
            await data.refresh()
            idx = _need_rows()
            row = _row(request, "row")
            return _json({"rows": [idx.row(i) for i in idx.group_rows(row)[:MAX_PAGE]]})

    async def api_diff(request: web.Request) -> web.Response:
        async with data.lock:
            await data.refresh()
            la, lb = data.locate(_row(request, "a")), data.locate(_row(request, "b"))

        def work() -> dict[str, Any]:
            va, vb = data.view(la), data.view(lb)
            marks = diff_marks(va["tokens"]["ids"], va["tokens"]["mask"], vb["tokens"]["ids"], vb["tokens"]["mask"])
            return {"a": va, "b": vb, **marks}

        try:
            return _json(await asyncio.to_thread(work))
        except (OSError, ValueError) as e:
            return _error(422, str(e))

    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static_file)
    app.router.add_get("/api/run", api_run)
    app.router.add_get("/api/metrics", api_metrics)
    app.router.add_get("/api/list", api_list)
    app.router.add_get("/api/trajectory", api_trajectory)
    app.router.add_get("/api/group", api_group)
    app.router.add_get("/api/diff", api_diff)
    return app


async def start(data: RunData, host: str = "127.0.0.1", port: int = 0, *, allowed_hosts: list[str] | None = None,
                idle_timeout_s: float = IDLE_TIMEOUT_S) -> tuple[web.AppRunner, str]:
    """Starts serving ``data``; returns the runner (``await runner.cleanup()`` stops it) and the page's URL.
    ``allowed_hosts``: the names the page may be reached by (default: loopback names and ``host``; any name for a
    wildcard bind)."""
    app = make_app(data)
    runner = app_runner(app, idle_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    app[HOSTS]["check"] = HostCheck(allowed_hosts if allowed_hosts is not None else default_hosts(host), bound)
    url_host = f"[{host}]" if ":" in host else host

    async def index_now() -> None:
        async with data.lock:
            await data.refresh()

    data.background = asyncio.ensure_future(index_now())  # the first API call waits for it (the lock)
    return runner, f"http://{url_host}:{bound}/"
