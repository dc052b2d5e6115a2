"""SkyRL-Gym envs as agentrl envs (the real skyrl-gym package): made per dataset row from a task file, rewards from
SkyRL's own scorers, ``agentrl envs check`` and 64 episodes at once through the manager."""

from __future__ import annotations

from pathlib import Path

import pytest

import agentrl
from agentrl.cli import main
from agentrl.envs.bridges.skyrl_gym_env import load_rows
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.policy import ScriptedPolicy

import skyrl_gym  # noqa: F401  the skyrl-gym extra (setup.sh installs it)

pytestmark = pytest.mark.timeout(300)

ROWS = str(Path(__file__).parent / "data" / "skyrl_gsm8k_rows.jsonl")
GSM8K, MULTI = "skyrl_gym/gsm8k", "skyrl_gym/gsm8k_multi_turn"


def test_single_turn_gsm8k_is_scored_by_skyrl():
    env = agentrl.make(GSM8K, tasks=ROWS)
    obs, info = env.reset(seed=0)
    assert obs[0]["content"].startswith("Tom has 3 boxes") and info["task_key"].startswith(f"{GSM8K}:")
    assert env.step("36 - 7 = 29\n#### 29")[1:3] == (1.0, True)
    env.reset(seed=0)
    assert env.step("#### 30")[1:3] == (0.0, True)
    assert agentrl.make(GSM8K, tasks=ROWS).reset(seed=4)[1]["task_key"] == info["task_key"]  # 4 rows: seed 4 is row 0
    fresh = agentrl.make(GSM8K, tasks=ROWS).unwrapped
    assert fresh.task_key(8) == info["task_key"] and fresh.sky is None  # task_key(seed) makes no SkyRL env


def test_multi_turn_gsm8k_gives_turn_rewards_and_observations():
    env = agentrl.make(MULTI, tasks=ROWS)
    env.reset(seed=1)
    obs, reward, terminated, _, _ = env.step("about #### 200")
    assert 0 < reward < 1 and not terminated and "#### ANSWER" in obs[0]["content"]  # format credit only
    assert env.step("#### 260")[1:3] == (1.0, True)


def test_bad_task_files_and_ids_say_what_is_wrong(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"prompt": "ok", "reward_spec": {"ground_truth": "1"}}\n{"question": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2: a row needs a 'prompt'"):
        agentrl.make(GSM8K, tasks=str(bad))
    with pytest.raises(agentrl.RegistrationError, match="did you mean 'skyrl_gym/gsm8k'"):
        agentrl.make("skyrl_gym/gsm8", tasks=ROWS)


def test_envs_check_with_the_task_file(capsys):
    assert main(["envs", "check", GSM8K, MULTI, f"tasks={ROWS}"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("2 passed, 0 failed")


async def test_64_episodes_at_once_through_the_manager_are_reproducible():
    rows = load_rows(ROWS)

    def answer(conversation, meta):
        return f"so the answer is\n#### {rows[meta.seed % len(rows)]['reward_spec']['ground_truth']}"

    specs = [EpisodeSpec(env_id, {"tasks": ROWS}, seed=s) for env_id in (GSM8K, MULTI) for s in range(32)]
    async with EnvManager(ManagerConfig(max_concurrency=64), ScriptedPolicy(answer)) as m:
        first = await m.run_episodes(specs)
        again = await m.run_episodes(specs[:8])
    assert [t.error for t in first + again] == [None] * 72
    assert all(t.reward == 1.0 and t.num_turns == 1 and t.termination == "terminated" for t in first + again)
    assert [t.messages for t in first[:8]] == [t.messages for t in again]


def _rows(path: Path, *rows: dict) -> str:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_envs_that_read_their_config_by_attribute_get_it_with_its_defaults(tmp_path):
    """SkyRL's search and text2sql read ``env_config.search_url`` / ``.db_path``: SkyRL's trainer hands them an
    OmegaConf config, and a plain dict failed at ``reset`` with an AttributeError. The env's own config dataclass
    gives the defaults; ``env_config`` overrides them, and a key the env does not have is refused by name."""
    import http.server
    import json
    import sqlite3
    import threading

    asked = []

    class Retriever(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            asked.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"result": [[{"document": {"contents": "Paris is the capital of France."}}]]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Retriever)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rows = _rows(tmp_path / "search.jsonl", {"prompt": "Capital of France?", "reward_spec": {"ground_truth":
                                                 {"target": ["Paris"]}}})
        url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
        env = agentrl.make("skyrl_gym/search", tasks=rows, env_config={"search_url": url})
        env.reset(seed=0)
        obs, reward, terminated, _, _ = env.step("<search>capital of France</search>")
        assert "Paris is the capital of France." in obs[0]["content"] and not terminated
        assert asked == [{"query": "capital of France", "topk": 3, "return_scores": True}]  # topk: the default
        assert env.step("<answer>Paris</answer>")[1:3] == (1.0, True)
    finally:
        server.shutdown()

    db = tmp_path / "sql" / "spider" / "database" / "shop" / "shop.sqlite"
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as conn:
        conn.executescript("CREATE TABLE item(name TEXT, price INT); INSERT INTO item VALUES ('pen', 2), ('cup', 5);")
    rows = _rows(tmp_path / "sql.jsonl", {"prompt": "The dearest item?", "db_id": "shop", "data": "spider",
                                          "reward_spec": {"ground_truth": "SELECT name FROM item ORDER BY price DESC LIMIT 1"}})
    env = agentrl.make("skyrl_gym/text2sql", tasks=rows, env_config={"db_path": str(tmp_path / "sql")})
    env.reset(seed=0)
    assert "cup" in env.step("<think>dear</think><sql>SELECT name FROM item WHERE price > 3</sql>")[0][0]["content"]
    assert env.step("<think>cup</think><solution>SELECT name FROM item WHERE price = 5</solution>")[1:3] == (1.0, True)
    env.reset(seed=0)  # SkyRL's format rule (a <think> first): -1
    assert env.step("<solution>SELECT name FROM item WHERE price = 5</solution>")[1:3] == (-1.0, True)

    with pytest.raises(ValueError, match=r"skyrl_gym/search: env_config: .*serch_url"):
        agentrl.make("skyrl_gym/search", tasks=rows, env_config={"serch_url": "http://x"}).reset(seed=0)
