"""OpenEnv both ways, against the real openenv-core: the echo environment that ``openenv init`` writes, served by
uvicorn on loopback, driven by agentrl's OpenEnv client env; and ``agentrl envs serve`` driven by the echo template's
own client and by openenv-core's ``GenericEnvClient``. 64 episodes at once through the manager; a server killed
mid-episode, one that answers garbage and one that never answers become failed episodes with clear errors."""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import agentrl
from agentrl.cli import main
from agentrl.envs import scripted_policy
from agentrl.envs.bridges.openenv_client import OpenEnvError
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy

pytestmark = pytest.mark.timeout(300)

CLIENT = "openenv/Client-v0"
GUESS = "agentrl/GuessNumber-v0"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(proc: subprocess.Popen, port: int, what: str) -> None:
    deadline = time.monotonic() + 120
    while True:  # until the server accepts connections (bounded; a dead server fails at once)
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            assert proc.poll() is None, f"{what} exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"{what} did not listen within 120 s"
            time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)


@pytest.fixture(scope="module")
def echo_template(tmp_path_factory):
    """The echo env that ``openenv init`` writes, unchanged, served by uvicorn on loopback; yields (url, dir)."""
    root = tmp_path_factory.mktemp("openenv")
    init = subprocess.run([str(BIN / "openenv"), "init", "echo_env"], cwd=root, capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stdout + init.stderr
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], cwd=root / "echo_env", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(proc, port, "the echo template's server")
        yield f"http://127.0.0.1:{port}", root
    finally:
        _stop(proc)


def _serve(env_id: str, *kwargs: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([str(BIN / "agentrl"), "envs", "serve", env_id, *kwargs, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    _wait_listening(proc, port, "agentrl envs serve")
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def served_guess():
    proc, url = _serve(GUESS)
    try:
        yield url
    finally:
        _stop(proc)


def test_client_env_drives_the_echo_template(echo_template):
    url, _ = echo_template
    env = agentrl.make(CLIENT, url=url)
    try:
        obs, info = env.reset(seed=1)
        assert obs == [{"role": "user", "content": "Echo Env environment ready!"}]
        assert env.unwrapped.action_field == "message"  # read from the server's /schema
        assert info["task_key"].startswith("openenv:")
        obs, reward, terminated, truncated, _ = env.step("hello there")
        assert obs == [{"role": "user", "content": "hello there"}]
        assert reward == pytest.approx(1.1) and not terminated and not truncated  # the template's 0.1 per character
        # the template allows one session at a time: a second one is refused with a clear error
        other = agentrl.make(CLIENT, url=url)
        with pytest.raises(OpenEnvError, match="refused reset: CAPACITY_REACHED"):
            other.reset(seed=2)
        other.close()
    finally:
        env.close()
    assert main(["envs", "check", CLIENT, f"url={url}"]) == 0


def test_the_echo_templates_own_client_drives_agentrl_envs_serve(echo_template, served_guess):
    _, root = echo_template
    sys.path.insert(0, str(root))
    try:
        echo = importlib.import_module("echo_env")
    finally:
        sys.path.remove(str(root))
    local_obs, _ = agentrl.make(GUESS).reset(seed=3)
    with echo.EchoEnv(base_url=served_guess).sync() as client:
        result = client.reset(seed=3)
        assert result.done is False and result.reward == 0.0
        result = client.step(echo.EchoAction(message="<answer>8</answer>"))
        assert result.done is False and result.reward == 0.0
    from openenv.core import GenericEnvClient

    with GenericEnvClient(base_url=served_guess).sync() as client:
        result = client.reset(seed=3)
        assert result.observation["messages"] == local_obs  # the same episode as the local env's
        conversation = list(local_obs)
        solve = agentrl.envs.solver_for(GUESS)
        while not result.done:
            action = solve(conversation)
            conversation.append({"role": "assistant", "content": action})
            result = client.step({"message": action})
            conversation += result.observation["messages"]
        assert result.reward == 1.0 and result.observation["truncated"] is False


async def test_64_episodes_at_once_through_the_manager_against_agentrl_envs_serve(served_guess):
    specs = [EpisodeSpec(CLIENT, {"url": served_guess}, seed=s) for s in range(64)]
    async with EnvManager(ManagerConfig(max_concurrency=64), scripted_policy(GUESS)) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:16])
    assert [t.error for t in first + again] == [None] * 80
    assert all(t.reward == 1.0 and t.termination == "terminated" for t in first + again)
    assert [t.messages for t in first[:16]] == [t.messages for t in again]
    # the remote episode is the local env's episode for the same seed
    local, _ = agentrl.make(GUESS).reset(seed=5)
    assert first[5].messages[: len(local)] == local


async def test_a_server_killed_mid_episode_fails_the_episode_with_a_clear_error():
    proc, url = _serve(GUESS)
    try:
        def act(conversation, meta):
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            return "<answer>8</answer>"

        async with EnvManager(ManagerConfig(max_failures_per_group=0), ScriptedPolicy(act)) as m:  # no retry
            (t,) = await m.run_episodes([EpisodeSpec(CLIENT, {"url": url}, seed=0)])
    finally:
        _stop(proc)
    assert t.termination == "error" and "OpenEnvError" in t.error and "closed the session during step" in t.error


class _RawServer:
    """A WebSocket server on loopback that answers every message with ``reply`` (None: never answers)."""

    def __init__(self, reply: str | None):
        from websockets.sync.server import serve

        self.release = threading.Event()

        def handler(ws):
            for _ in ws:
                if reply is None:
                    self.release.wait(60)
                    return
                ws.send(reply)

        self.server = serve(handler, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.thread.join(10)


@pytest.mark.parametrize("reply, message", [
    ("certainly not json", "with something that is not JSON"),
    (json.dumps({"type": "observation", "data": {"reward": 1}}), "outside the protocol"),
    (json.dumps({"type": "error", "data": {"code": "EXECUTION_ERROR", "message": "boom"}}), "refused reset: EXECUTION_ERROR: boom"),
    (None, "did not answer reset within 1 s"),
])
def test_garbage_error_and_silent_servers_fail_with_a_clear_error(reply, message):
    server = _RawServer(reply)
    try:
        env = agentrl.make(CLIENT, url=server.url, action_field="message", call_timeout_s=1)
        t0 = time.monotonic()
        with pytest.raises(OpenEnvError, match=message):
            env.reset(seed=0)
        assert time.monotonic() - t0 < 30
        env.close()
    finally:
        server.stop()


def test_unreachable_server_and_bad_url():
    with pytest.raises(OpenEnvError, match="cannot read the action schema"):
        agentrl.make(CLIENT, url=f"http://127.0.0.1:{_free_port()}", connect_timeout_s=2).reset(seed=0)
    with pytest.raises(ValueError, match="url must look like http://HOST:PORT"):
        agentrl.make(CLIENT, url="localhost")


def test_envs_serve_refuses_a_bad_id_or_kwarg_in_one_line(capsys):
    assert main(["envs", "serve", "agentrl/NoSuchEnv-v0", "--port", str(_free_port())]) == 1
    assert "RegistrationError: unknown env id 'agentrl/NoSuchEnv-v0'" in capsys.readouterr().out
    assert main(["envs", "serve", "reasoning_gym/leg_counting", "legs=3", "--port", str(_free_port())]) == 1
    assert "unknown config field(s) ['legs']" in capsys.readouterr().out
    assert main(["envs", "serve", GUESS, "--max-sessions", "0"]) == 2
    assert "--max-sessions must be in [1, 4096]" in capsys.readouterr().out


class _ThreadEcho(agentrl.Env):
    """Sync: says which thread ran reset and each step."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": f"seed {seed}"}], {"thread": threading.get_ident()}

    def step(self, action):
        return [{"role": "user", "content": action}], 1.0, action == "stop", False, {"thread": threading.get_ident()}


class _AsyncOnly(agentrl.Env):
    """Async methods only (its sync reset/step are gymnasium's stubs): the server must await them."""

    async def areset(self, *, seed=None, options=None):
        return [{"role": "user", "content": f"async seed {seed}"}], {}

    async def astep(self, action):
        return [{"role": "user", "content": action.upper()}], 0.5, True, False, {}


@pytest.fixture
def test_envs():
    ids = {"test-openenv/ThreadEcho-v0": _ThreadEcho, "test-openenv/AsyncOnly-v0": _AsyncOnly}
    for env_id, cls in ids.items():
        agentrl.register(env_id, entry_point=cls)
    yield list(ids)
    import gymnasium

    from agentrl import registration

    for env_id in ids:
        del gymnasium.registry[env_id]
        registration._agentrl_ids.discard(env_id)


def _ws_episode(app, actions):
    from starlette.testclient import TestClient

    replies = []
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        ws.send_text(json.dumps({"type": "reset", "data": {"seed": 3}}))
        replies.append(ws.receive_json())
        for action in actions:
            ws.send_text(json.dumps({"type": "step", "data": {"message": action}}))
            replies.append(ws.receive_json())
    return [r["data"] for r in replies]


def test_served_sync_envs_keep_one_thread_per_episode_and_async_envs_are_awaited(test_envs):
    from agentrl.envs.bridges.openenv_server import make_app

    sync_id, async_id = test_envs
    replies = _ws_episode(make_app(sync_id), ["a", "b", "stop"])
    threads = {r["observation"]["info"]["thread"] for r in replies}
    assert len(threads) == 1 and threading.get_ident() not in threads  # one session thread, not the caller's
    assert [r["done"] for r in replies] == [False, False, False, True]
    replies = _ws_episode(make_app(async_id), ["go"])
    assert replies[0]["observation"]["messages"] == [{"role": "user", "content": "async seed 3"}]
    assert replies[1]["observation"]["messages"] == [{"role": "user", "content": "GO"}]
    assert (replies[1]["reward"], replies[1]["done"]) == (0.5, True)


@pytest.fixture(scope="module")
def typed_servers():
    """openenv-core servers whose actions are an int field and a two-field tool call; yields {kind: url}."""
    procs, urls = [], {}
    try:
        for kind in ("counter", "tools"):
            port = _free_port()
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__).parent / "openenv_typed_server.py"),
                                           kind, str(port)]))
            _wait_listening(procs[-1], port, f"the {kind} server")
            urls[kind] = f"http://127.0.0.1:{port}"
        yield urls
    finally:
        for p in procs:
            _stop(p)


def test_an_integer_action_is_parsed_from_the_answer_and_a_bad_one_is_an_invalid_action(typed_servers):
    env = agentrl.make(CLIENT, url=typed_servers["counter"], invalid_reward=-0.5)
    obs, _ = env.reset(seed=0)
    assert obs[0]["role"] == "system" and "'amount' (integer)" in obs[0]["content"]  # what to answer, from /schema
    assert env.step("<answer>2</answer>")[:3] == ([{"role": "user", "content": "total 2"}], 0.0, False)
    msgs, reward, terminated, truncated, info = env.step("two, please")
    assert (reward, terminated, truncated) == (-0.5, False, False) and "'amount' must be an integer" in info["invalid_action"]
    assert msgs[0]["content"].startswith("Invalid action:")
    assert env.step("I add <answer>3</answer>")[1:3] == (1.0, True)  # the session went on after the bad turn
    env.close()


def test_a_several_field_action_is_a_json_object_checked_here_and_by_the_server(typed_servers):
    env = agentrl.make(CLIENT, url=typed_servers["tools"])
    obs, _ = env.reset(seed=0)
    assert '"tool": string' in obs[0]["content"] and '"arguments": object' in obs[0]["content"]
    assert env.step('I call {"tool": "add", "arguments": {"a": 40, "b": 2}} now.')[0][0]["content"] == "42"
    _, reward, terminated, _, info = env.step('<answer>{"tool": "answer"}</answer>')
    assert (reward, terminated) == (0.0, False) and "misses 'arguments'" in info["invalid_action"]
    _, reward, terminated, _, info = env.step('<answer>{"tool": 7, "arguments": {}}</answer>')  # the server says no
    assert not terminated and "the server refused the action" in info["invalid_action"]
    assert env.step('```json\n{"tool": "answer", "arguments": {"value": 42}}\n```')[1:3] == (1.0, True)
    env.close()


@pytest.mark.parametrize("schema, field, kind", [
    ({"properties": {"message": {"type": "string"}, "metadata": {"type": "object"}}, "required": ["message"]},
     "message", "string"),
    ({"properties": {"action_id": {"type": "integer"}}, "required": ["action_id"]}, "action_id", "integer"),
    ({"properties": {"x": {"anyOf": [{"type": "null"}, {"type": "number"}]}}}, "x", "number"),
    ({"properties": {"move": {"enum": ["up", "down"]}}, "required": ["move"]}, "move", "string"),
    ({"properties": {"tool": {"type": "string"}, "args": {"type": "object"}}, "required": ["tool", "args"]},
     None, "object"),
])
def test_action_shapes_of_the_schemas_pydantic_writes(schema, field, kind):
    from agentrl.envs.bridges.openenv_actions import action_shape

    shape = action_shape(schema)
    assert (shape.field, shape.type) == (field, kind)


@pytest.mark.parametrize("text, value", [
    ("<answer>3.</answer>", 3),           # the answer is read as every built-in env reads it: trailing punctuation off
    ("I pick <ANSWER> '7' </ANSWER>", 7),  # any case of the tag, quotes off
    ("`2`", 2),
])
def test_a_typed_answer_is_read_like_every_envs_answer(text, value):
    from agentrl.envs.bridges.openenv_actions import ActionShape, build_action

    assert build_action(ActionShape("action_id", "integer", ("action_id",), "{action_id: integer}"), text) == {
        "action_id": value}


def test_a_served_env_refuses_other_sites_pages_and_rebound_host_names(served_guess):
    """A web page the user opens can reach a loopback server: its WebSocket needs no CORS preflight, and a name it
    rebinds to 127.0.0.1 reaches it as same-origin. `agentrl envs serve` refuses both, as the gateway does, and
    OpenEnv's own clients (which send no Origin) still get their session."""
    import asyncio

    import urllib.error
    import urllib.request

    import websockets

    port = int(served_guess.rsplit(":", 1)[1])

    async def handshake(headers: dict[str, str], name: str = "127.0.0.1") -> int | str:
        try:  # the Host header names `name`; the connection goes to loopback whatever it is
            async with websockets.connect(f"ws://{name}:{port}/ws", host="127.0.0.1", port=port,
                                          additional_headers=headers) as ws:
                await ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
                return json.loads(await ws.recv())["type"]
        except websockets.InvalidStatus as e:
            return e.response.status_code

    assert asyncio.run(handshake({"Origin": "http://evil.example"})) == 403
    assert asyncio.run(handshake({}, "evil.example")) == 421
    assert asyncio.run(handshake({})) == "observation"

    def post(path: str, headers: dict[str, str], body: bytes = b'{"seed": 1}') -> int:
        req = urllib.request.Request(f"{served_guess}{path}", data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    json_type = {"Content-Type": "application/json"}
    assert post("/reset", {**json_type, "Origin": "http://evil.example"}) == 403
    assert post("/reset", {**json_type, "Host": "evil.example"}) == 421
    assert post("/reset", {"Content-Type": "text/plain"}) == 415  # a cross-site "simple" request: no preflight
    assert post("/reset", json_type) == 200


def test_a_served_episode_refuses_a_step_before_its_reset_or_after_its_end(served_guess):
    """An OpenEnv client may step a session it never reset, or one whose episode is done: the agentrl env must not
    play on from an undefined state; the client gets an error naming what to do. openenv-core's stateless HTTP
    ``/step`` (a fresh env per request) is one such step."""
    import asyncio
    import urllib.error
    import urllib.request

    import websockets

    ws_url = served_guess.replace("http://", "ws://") + "/ws"

    async def play() -> tuple[dict, list[dict], dict]:
        async with websockets.connect(ws_url) as ws:
            async def send(kind: str, data: dict) -> dict:
                await ws.send(json.dumps({"type": kind, "data": data}))
                return json.loads(await ws.recv())

            early = await send("step", {"message": "<answer>3</answer>"})
            frames = [await send("reset", {"seed": 3})]
            while not frames[-1]["data"].get("done") and len(frames) < 40:
                frames.append(await send("step", {"message": "no guess here"}))
            return early, frames, await send("step", {"message": "<answer>3</answer>"})

    early, frames, late = asyncio.run(play())
    assert early["type"] == "error" and "reset" in early["data"]["message"], early
    assert frames[-1]["type"] == "observation" and frames[-1]["data"]["done"], frames[-1]
    assert late["type"] == "error" and "reset" in late["data"]["message"], late
    req = urllib.request.Request(f"{served_guess}/step", data=json.dumps({"action": {"message": "hi"}}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 409 and "reset" in json.loads(e.value.read())["detail"]


def test_a_client_closing_its_session_leaves_no_traceback_in_the_servers_log(tmp_path):
    """openenv-core closes every WebSocket session after its client left, which raised out of the app: each
    session's end logged an "Exception in ASGI application" traceback, drowning real errors."""
    import asyncio

    import websockets

    log = tmp_path / "serve.log"
    port = _free_port()
    with open(log, "wb") as err:
        proc = subprocess.Popen([str(BIN / "agentrl"), "envs", "serve", GUESS, "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_listening(proc, port, "agentrl envs serve")

        async def sessions() -> list[str]:
            kinds = []
            for seed in range(3):
                async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
                    await ws.send(json.dumps({"type": "reset", "data": {"seed": seed}}))
                    kinds.append(json.loads(await ws.recv())["type"])
            ws = await websockets.connect(f"ws://127.0.0.1:{port}/ws")  # and one that just drops the connection
            ws.transport.abort()
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:  # served after all of them
                await ws.send(json.dumps({"type": "reset", "data": {"seed": 9}}))
                kinds.append(json.loads(await ws.recv())["type"])
            return kinds

        assert asyncio.run(sessions()) == ["observation"] * 4
    finally:
        _stop(proc)
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text, text[-3000:]
