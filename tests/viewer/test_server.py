"""The viewer's HTTP surface: only the run directory's known files, no traversal (plain, encoded, doubly encoded,
backslashes, links), Host checks against DNS rebinding, security headers on every response, API errors that name
the parameter."""

import asyncio
import json
import threading
from pathlib import Path

import pytest

from agentrl.viewer.server import CSP, RunData, start

SECRET = "TOP-SECRET-7d1f"


async def raw_get(url: str, target: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """Sends ``GET target`` byte for byte (no client-side normalisation of ``..`` or escapes)."""
    hostport = url.split("//", 1)[1].rstrip("/")
    ip, port = hostport.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(ip, int(port))
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host or hostport}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        out, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return int(lines[0].split()[1]), headers, body


class ThreadServer:
    """The viewer served in-process from its own event-loop thread (one server for a whole test module)."""

    def __init__(self, data: RunData):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner, self.url = asyncio.run_coroutine_threadsafe(start(data, "127.0.0.1", 0), self.loop).result(60)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served(run_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """A copy of the run directory served in-process, with secrets planted next to it and one level up."""
    import shutil

    root = tmp_path_factory.mktemp("served") / "run"
    shutil.copytree(run_dir, root)
    (root.parent / "secret.txt").write_text(SECRET)
    (root / "config.yaml").write_text(f"# {SECRET}\n")  # inside the run dir, but not a file the viewer serves
    srv = ThreadServer(RunData(root))
    yield srv.url
    srv.close()


TRAVERSALS = [
    "/../secret.txt", "/static/../../secret.txt", "/static/..%2f..%2fsecret.txt", "/static/%2e%2e%2f%2e%2e%2fsecret.txt",
    "/static/%2e%2e/%2e%2e/secret.txt", "/static/..%5c..%5csecret.txt", "/static/%252e%252e%252fsecret.txt",
    "/static/..\\..\\secret.txt", "/%2e%2e/secret.txt", "/static/%2e%2e%2fserver.py", "/static/../server.py",
    "/static/..%2fconfig.yaml", "/config.yaml", "/metrics.jsonl", "/trajectories.jsonl", "/static//etc/passwd",
    "/api/trajectory?row=../../secret.txt", "/api/trajectory?row=%2e%2e%2fsecret.txt", "/api/list?env=../../secret.txt",
    "/api/diff?a=0&b=../secret.txt", "/api/metrics?keys=../../secret.txt",
]


@pytest.mark.parametrize("target", TRAVERSALS)
async def test_no_path_leaves_the_served_files(served, target):
    status, headers, body = await raw_get(served, target)
    assert SECRET.encode() not in body
    assert b"def make_app" not in body  # the server's own source
    assert b"root:" not in body
    assert headers.get("content-security-policy") == CSP
    if not target.startswith("/api/"):
        assert status in (400, 404), (target, status)


async def test_security_headers_and_the_page(served):
    status, headers, body = await raw_get(served, "/")
    assert status == 200 and b'<script src="/static/app.js" defer></script>' in body
    assert b"<script>" not in body and b"http" not in body.lower().replace(b"http-equiv", b"")  # no external asset
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
    status, headers, body = await raw_get(served, "/static/app.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript")
    for sink in (b"innerHTML", b"outerHTML", b"insertAdjacentHTML", b"document.write", b"eval(", b"Function(",
                 b"setAttribute(\"on", b"https://"):
        assert sink not in body, sink
    assert body.count(b"http://") == body.count(b"http://www.w3.org/2000/svg")  # a namespace name, not a fetch
    status, headers, _ = await raw_get(served, "/nope")
    assert status == 404 and headers["content-security-policy"] == CSP


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.nip.io", ""])
async def test_a_foreign_host_header_is_refused(served, host):
    """A page whose DNS name was rebound to 127.0.0.1 sends its own Host: it gets nothing."""
    port = served.rsplit(":", 1)[1].rstrip("/")
    for target in ("/", "/api/run", "/api/trajectory?row=0"):
        status, _, body = await raw_get(served, target, host=host or f"evil:{port}")
        assert status == 421 and b"trajectory" not in body
    status, _, _ = await raw_get(served, "/api/run", host=f"localhost:{port}")
    assert status == 200


async def test_api(served):
    status, _, body = await raw_get(served, "/api/run")
    run = json.loads(body)
    assert status == 200 and run["rows"] == 24 and run["files"]["logprobs"] == "trainer_logprobs.jsonl"
    assert "reward" in run["metric_keys"] and run["tokenizer"].endswith("tokenizer.json")
    status, _, body = await raw_get(served, "/api/list?env=agentrl/ToolUse-v0&sort=reward&desc=1&limit=5")
    page = json.loads(body)
    assert page["total"] == 12 and len(page["rows"]) == 5
    assert [r["reward"] for r in page["rows"]] == sorted((r["reward"] for r in page["rows"]), reverse=True)
    status, _, body = await raw_get(served, "/api/trajectory?row=3")
    v = json.loads(body)
    assert status == 200 and v["meta"]["row"] == 3 and v["tokens"]["n"] == len(v["tokens"]["ids"])
    status, _, body = await raw_get(served, "/api/group?row=3")
    group = json.loads(body)["rows"]
    assert len(group) == 3 and len({r["group_id"] for r in group}) == 1
    status, _, body = await raw_get(served, f"/api/diff?a={group[0]['row']}&b={group[1]['row']}")
    d = json.loads(body)
    assert status == 200 and len(d["same_a"]) == d["a"]["tokens"]["n"]
    status, _, body = await raw_get(served, "/api/metrics?keys=reward,train/loss")
    cols = json.loads(body)["columns"]
    assert cols["step"] == [1.0, 2.0] and len(cols["reward"]) == 2


@pytest.mark.parametrize("target, message", [
    ("/api/trajectory?row=24", "row: 24 is out of range"), ("/api/trajectory?row=-1", "out of range"),
    ("/api/trajectory?row=x", "row: expected an integer"), ("/api/trajectory", "row: required"),
    ("/api/list?limit=100000", "limit"), ("/api/list?staleness_min=a", "staleness_min: expected a number"),
    ("/api/list?reward_max=inf", "reward_max: expected a finite number"),
])
async def test_bad_parameters_are_named(served, target, message):
    status, _, body = await raw_get(served, target)
    assert status == 400 and message in json.loads(body)["error"]


async def test_only_get(served):
    hostport = served.split("//", 1)[1].rstrip("/")
    ip, port = hostport.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(ip, int(port))
    writer.write(f"POST /api/run HTTP/1.1\r\nHost: {hostport}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    assert data.split()[1] == b"405"


async def test_a_link_out_of_the_run_directory_is_not_followed(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(json.dumps({"token_ids": [1], "messages": [{"role": "user", "content": SECRET}]}) + "\n")
    (root / "trajectories.jsonl").symlink_to(outside)
    (root / "metrics.jsonl").symlink_to("/etc/passwd")
    data = RunData(root)
    assert data.trajectories is None and data.metrics is None
    assert any("outside the served directory" in n for n in data.notes)
    runner, url = await start(data, "127.0.0.1", 0)
    try:
        status, _, body = await raw_get(url, "/api/trajectory?row=0")
        assert status == 404 and SECRET.encode() not in body
        status, _, body = await raw_get(url, "/api/run")
        assert SECRET.encode() not in body and b"root:" not in body
    finally:
        await runner.cleanup()


def test_cli_refuses_a_missing_path(tmp_path, capsys):
    from agentrl.cli import main

    assert main(["view", str(tmp_path / "nope")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_a_single_file_serves_that_file_only(run_dir):
    data = RunData(run_dir / "trajectories.jsonl")
    assert data.files == {"trajectories": "trajectories.jsonl"} and data.metrics is None and data.logprobs is None
    assert data.decoder is not None  # the tokenizer of the run it sits in is still found


async def test_files_that_appear_later_are_picked_up(run_dir, tmp_path):
    """A viewer started on a run that has not written its files yet shows them once they appear."""
    import shutil

    root = tmp_path / "run"
    root.mkdir()
    runner, url = await start(RunData(root), "127.0.0.1", 0)
    try:
        run = json.loads((await raw_get(url, "/api/run"))[2])
        assert run["rows"] == 0 and any("no trajectories.jsonl" in n for n in run["notes"])
        for name in ("trajectories.jsonl", "trainer_logprobs.jsonl", "metrics.jsonl"):
            shutil.copy(run_dir / name, root / name)
        run = json.loads((await raw_get(url, "/api/run"))[2])
        assert run["rows"] == 24 and set(run["files"]) == {"trajectories", "logprobs", "metrics"}
        status, _, body = await raw_get(url, "/api/trajectory?row=0")
        assert status == 200 and json.loads(body)["tokens"]["tlp"] is not None
    finally:
        await runner.cleanup()
