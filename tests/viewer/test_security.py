"""The viewer against hostile run files and slow clients (issue 34): integers of 2^63 and more, lone surrogates in
ids and env names, bidi control characters (marked in the page, checked in Chromium), and a header timeout."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from agentrl.testing.browser import Chromium, needs_chromium
from agentrl.trajectory import Trajectory
from agentrl.viewer.server import RunData, start

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests run with --import-mode=importlib
from test_server import raw_get  # noqa: E402


def traj(tid: str, env: str = "agentrl/Env-v0", **kw) -> dict:
    t = Trajectory(id=tid, group_id="g", env_id=env, token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0, -0.5, -0.5],
                   versions=[-1, 0, 0], prompt_len=1, reward=1.0, rewards=[1.0], num_turns=1)
    d = t.to_dict()
    d.update(kw)
    return d


async def all_api_calls(root: Path) -> dict[str, tuple[int, bytes]]:
    runner, url = await start(RunData(root), "127.0.0.1", 0)
    try:
        out = {}
        for target in ("/api/run", "/api/list", "/api/metrics?keys=big,huge,ok", "/api/trajectory?row=0",
                       "/api/trajectory?row=1", "/api/group?row=0", "/api/diff?a=0&b=1"):
            status, _, body = await raw_get(url, target)
            out[target] = (status, body)
        return out
    finally:
        await runner.cleanup()


async def test_integers_of_2_to_the_63_and_more_do_not_break_the_api(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    lines = [
        # agentrl train's format (the summary read from the line's head) with a step past int64
        json.dumps({"step": 2 ** 63, "summary": {"id": "a", "reward": 1.0, "tokens": 3}, "trajectory": traj("a")}),
        # a plain Trajectory with huge numbers in the list's columns
        json.dumps(traj("b", reward=10 ** 400, num_turns=2 ** 64, prompt_len=-(2 ** 70))),
    ]
    (root / "trajectories.jsonl").write_text("\n".join(lines) + "\n")
    (root / "metrics.jsonl").write_text(json.dumps({"step": 1, "big": 2 ** 63, "huge": 10 ** 400, "ok": 0.5}) + "\n"
                                        + json.dumps({"step": 2 ** 64, "ok": 1.0}) + "\n")
    got = await all_api_calls(root)
    assert {t: s for t, (s, _) in got.items()} == {t: 200 for t in got}, got
    run = json.loads(got["/api/run"][1])
    assert run["rows"] == 2
    cols = json.loads(got["/api/metrics?keys=big,huge,ok"][1])["columns"]
    assert cols["ok"] == [0.5, 1.0] and cols["big"] == [float(2 ** 63), None] and "huge" not in cols


async def test_lone_surrogates_in_ids_and_envs(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    lines = [json.dumps(traj("id\udcff", env="env\udcff")), json.dumps(traj("b\ud800", env="e"))]
    (root / "trajectories.jsonl").write_text("\n".join(lines) + "\n")  # json.dumps escapes them: valid JSON lines
    got = await all_api_calls(root)
    assert {t: s for t, (s, _) in got.items() if "metrics" not in t} == {t: 200 for t in got if "metrics" not in t}
    rows = json.loads(got["/api/list"][1])["rows"]
    assert rows[0]["id"] == "id\udcff" and rows[0]["env"] == "env\udcff"  # as written (escaped in the JSON)


async def test_a_slow_header_is_cut_off(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    runner, url = await start(RunData(root), "127.0.0.1", 0, idle_timeout_s=0.5)
    try:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /api/run HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 20) == b""  # closed, no answer
        writer.close()
    finally:
        await runner.cleanup()


BIDI = "safe\u202eexe.txt"


@needs_chromium()
def test_bidi_controls_are_marked_in_the_page(view, tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    t = traj(BIDI, env="env\u2067x\u2069", messages=[{"role": "user", "content": f"open {BIDI}"}], token_ids=[],
             loss_mask=[], logprobs=[], versions=[], prompt_len=0)
    (root / "trajectories.jsonl").write_text(json.dumps(t) + "\n")
    srv = view(root)

    async def go():
        async with Chromium() as page:
            await page.navigate(srv.url)
            await page.wait_for("document.body.dataset.listReady")
            cells = await page.evaluate("[...document.querySelectorAll('#list tbody td')].map(t => t.textContent)")
            await page.evaluate("location.hash = '#/t/0'")
            await page.wait_for("document.body.dataset.trajComplete === '0'")
            shown = await page.evaluate("document.getElementById('chat').textContent + "
                                        "document.getElementById('traj-head').textContent")
            return cells, shown

    cells, shown = asyncio.run(go())
    text = " ".join(cells) + shown
    for ch in "\u202e\u2067\u2069":
        assert ch not in text  # a control character never reaches the screen unmarked
    assert "safe⟨U+202E⟩exe.txt" in cells and "env⟨U+2067⟩x⟨U+2069⟩" in cells
    assert "open safe⟨U+202E⟩exe.txt" in shown


async def test_allowed_hosts_are_configurable(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    runner, url = await start(RunData(root), "127.0.0.1", 0, allowed_hosts=["viewer.example"])
    try:
        port = url.rstrip("/").rsplit(":", 1)[1]
        assert (await raw_get(url, "/api/run", host=f"viewer.example:{port}"))[0] == 200
        assert (await raw_get(url, "/api/run", host=f"VIEWER.example:{port}"))[0] == 200
        assert (await raw_get(url, "/api/run", host=f"viewer.example:{int(port) + 1}"))[0] == 421
        assert (await raw_get(url, "/api/run", host=f"127.0.0.1:{port}"))[0] == 421  # the list replaces the default
    finally:
        await runner.cleanup()
