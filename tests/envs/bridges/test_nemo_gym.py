"""The NeMo Gym client against a stand-in server written from nemo-gym 0.7.0's Gymnasium protocol
(``nemo_gym_standin.py``; nemo-gym itself needs Python >= 3.13.14, which this machine has not). Episodes by session
cookie, concurrency through the manager, and the faults: a hang, garbage, a request outside the schema (422), and a
server killed mid-episode."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

import agentrl
from agentrl.envs.bridges.nemo_gym_client import NeMoGymEnv, NeMoGymError, response_object
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy
from agentrl.testing.procs import serve_script

pytestmark = pytest.mark.timeout(300)

NEMO = "nemo_gym/Gymnasium-v0"
STANDIN = Path(__file__).with_name("nemo_gym_standin.py")
PROMPT = [{"role": "system", "content": "Guess the number."}, {"role": "user", "content": "Start."}]


@pytest.fixture
def server():
    with serve_script(STANDIN) as served:
        yield served


@pytest.fixture
def rows(tmp_path) -> str:
    path = tmp_path / "guess.jsonl"
    path.write_text("".join(json.dumps({"responses_create_params": {"input": PROMPT}, "secret": s,
                                        "agent_ref": {"type": "responses_api_agents", "name": "guess_agent"}}) + "\n"
                            for s in (3, 7, 1, 8, 5)))
    return str(path)


def _bisect(conversation, meta) -> str:
    lo, hi = 1, 8
    guesses = [m["content"] for m in conversation if m["role"] == "assistant"]
    hints = [m["content"] for m in conversation if m["role"] == "user" and "guesses left" in m["content"]]
    for g, h in zip(guesses, hints):
        n = int(g.split("<action>")[1].split("<")[0])
        lo, hi = (n + 1, hi) if h.startswith("higher") else (lo, n - 1)
    return f"<action>{(lo + hi) // 2}</action>"


def test_an_episode_over_the_protocol(server, rows):
    _, url = server
    env = agentrl.make(NEMO, url=url, tasks=rows)
    try:
        obs, info = env.reset(seed=1)  # secret 7
        assert obs[:2] == PROMPT and obs[2]["content"].startswith("Guess my number in 1..8")
        assert info["task_key"] == env.unwrapped.task_key(6) != env.unwrapped.task_key(0)
        out, reward, term, trunc, _ = env.step("<action>4</action>")
        assert out == [{"role": "user", "content": "higher; 3 guesses left."}] and (reward, term, trunc) == (0.0, False, False)
        out, reward, term, trunc, info = env.step("I think <action>7</action>")
        assert (out, reward, term, trunc, info["result"]) == ([], 1.0, True, False, "win")
        env.reset(seed=0)  # secret 3: four wrong guesses end it truncated
        for _ in range(3):
            assert env.step("<action>8</action>")[3] is False
        assert env.step("<action>8</action>")[1:4] == (0.0, False, True)
    finally:
        env.close()


def test_the_episode_is_the_session_cookie(server, rows):
    """Two episodes interleaved on one server keep their own state: each env has its own cookie jar."""
    _, url = server
    a, b = NeMoGymEnv(url, rows), NeMoGymEnv(url, rows)
    a.reset(seed=1)  # secret 7
    b.reset(seed=2)  # secret 1
    assert a.step("<action>4</action>")[0][0]["content"].startswith("higher")
    assert b.step("<action>4</action>")[0][0]["content"].startswith("lower")
    assert a.step("<action>7</action>")[1] == 1.0 and b.step("<action>1</action>")[1] == 1.0


def test_the_step_request_is_the_schema_nemo_validates(server):
    """What the real server's pydantic models require: a request without ``response`` fields gets 422."""
    _, url = server
    body = {"responses_create_params": {"input": PROMPT}}
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())

    def post(path, payload):
        req = urllib.request.Request(url + path, json.dumps(payload).encode(), {"Content-Type": "application/json"})
        return opener.open(req, timeout=10)

    post("/reset", body)
    with pytest.raises(urllib.error.HTTPError) as err:
        post("/step", {**body, "response": {"output": []}})
    assert err.value.code == 422 and json.loads(err.value.read())["detail"][0]["loc"] == ["body", "response", "id"]
    full = response_object("<action>5</action>")
    assert json.loads(post("/step", {**body, "response": full}).read())["reward"] == 1.0  # default secret 5


async def test_32_episodes_at_once_through_the_manager(server, rows):
    _, url = server
    specs = [EpisodeSpec(NEMO, {"url": url, "tasks": rows}, seed=s) for s in range(32)]
    async with EnvManager(ManagerConfig(max_concurrency=32), ScriptedPolicy(_bisect)) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:8])
    assert [t.error for t in first + again] == [None] * 40
    assert all(t.reward == 1.0 and t.termination == "terminated" for t in first + again)
    assert [t.messages for t in first[:8]] == [t.messages for t in again]


def test_faults_become_clear_errors(server, rows, tmp_path):
    proc, url = server
    env = NeMoGymEnv(url, rows, call_timeout_s=2)
    env.reset(seed=0)
    t0 = time.monotonic()
    with pytest.raises(NeMoGymError, match="POST /step failed: .*timed out"):
        env.step("HANG")
    assert time.monotonic() - t0 < 20
    env.reset(seed=0)
    with pytest.raises(NeMoGymError, match="POST /step answered with something that is not JSON"):
        env.step("GARBAGE")
    env.reset(seed=0)
    proc.kill()
    proc.wait()
    with pytest.raises(NeMoGymError, match="POST /step failed: ConnectionRefusedError"):
        env.step("<action>3</action>")
    with pytest.raises(NeMoGymError, match="POST /reset failed"):
        env.reset(seed=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"responses_create_params": {}}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a row needs responses_create_params.input"):
        NeMoGymEnv(url, str(bad))
    with pytest.raises(ValueError, match="url must look like"):
        NeMoGymEnv("localhost:1", rows)
