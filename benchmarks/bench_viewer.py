"""Viewer benchmark: how fast ``agentrl view`` opens a long trajectory and lists a large run, in headless Chromium.

    .venv/bin/python benchmarks/bench_viewer.py                       # defaults below, prints a markdown table
    .venv/bin/python benchmarks/bench_viewer.py --screenshot-run runs/quickstart --screenshot docs/viewer.png

Data: written by the real writer (:class:`agentrl.controller.runlog.TrajectoryLog`) from real :class:`Trajectory` objects
whose tokens are the tiny model's tokenizer applied to chat-formatted text:

- ``long``: one 100-turn trajectory of ``--long-tokens`` (default 65,536) tokens (assistant turns with tool calls,
  env messages, versions spread over 4 policy versions) plus its trainer log-prob record;
- ``list``: ``--list-rows`` (default 100,000) trajectories of ~``--list-tokens`` tokens in 2,000-step order.

Measured (each ``--repeats`` times; median and max): opening the long trajectory from the list (hash change ->
first screen drawn, and -> every token drawn; each two animation frames after the page says so, so layout and
paint are in) and by its URL in a fresh tab (page, script, run info and trajectory); the server indexing the
100k-line file on start; indexing 10k of its lines by the summary at each line's head against parsing each line
whole (the fallback for files other writers made); the list's first page, a filtered and sorted page and the last
page in a fresh tab; one filtered, sorted API page deep in the list; the server's resident memory after indexing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from agentrl.controller.runlog import TrajectoryLog
from agentrl.trajectory import Trajectory
from agentrl.testing.browser import Chromium

WORDS = ("the agent calls a tool to read the file then edits the function and runs the tests again because the first "
         "attempt failed with an import error in module utils line 42 so it looks at the traceback").split()


def tokenizer():
    from agentrl.chat import load_tokenizer
    from agentrl.models import ensure_tiny_model

    return load_tokenizer(ensure_tiny_model() / "tokenizer.json").backend_tokenizer


def text(rng: random.Random, words: int) -> str:
    lines, line = [], []
    for _ in range(words):
        line.append(rng.choice(WORDS))
        if len(line) >= 14:
            lines.append(" ".join(line))
            line = []
    return "\n".join(lines + [" ".join(line)])


def long_trajectory(tok, target_tokens: int, turns: int = 100, seed: int = 0) -> Trajectory:
    """A ``turns``-turn trajectory of about ``target_tokens`` tokens, built like the agent loop builds one."""
    words = max(4, int(target_tokens / turns / 2 / 1.6))
    t = _long(tok, words, turns, seed)
    return _long(tok, max(4, round(words * target_tokens / len(t.token_ids))), turns, seed)  # calibrated


def _long(tok, per_turn_words: int, turns: int, seed: int) -> Trajectory:
    rng = random.Random(seed)
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    ids, mask, lps, vers, msgs, rewards = [], [], [], [], [], []

    def add(tokens: list[int], generated: bool, version: int = -1) -> None:
        ids.extend(tokens)
        mask.extend([int(generated)] * len(tokens))
        lps.extend([-rng.expovariate(3.0) if generated else 0.0 for _ in tokens])
        vers.extend([version if generated else -1] * len(tokens))

    system = "You are a coding agent. Use tools like <tool_call>{\"name\": \"bash\", \"arguments\": {}}</tool_call>."
    user = "Fix the failing test in the repository."
    msgs += [{"role": "system", "content": system}, {"role": "user", "content": user}]
    add(enc(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"), False)
    prompt_len = len(ids)
    for k in range(turns):
        body = text(rng, per_turn_words)
        action = f"{body}\n<tool_call>{{\"name\": \"bash\", \"arguments\": {{\"cmd\": \"pytest -x tests/test_{k}.py\"}}}}</tool_call>"
        add(enc(action + "<|im_end|>"), True, version=k * 4 // turns)
        msgs.append({"role": "assistant", "content": action})
        rewards.append(1.0 if k == turns - 1 else 0.0)
        if k < turns - 1:
            obs = text(rng, per_turn_words)
            msgs.append({"role": "tool", "name": "bash", "content": obs})
            add(enc(f"\n<|im_start|>tool\n{obs}<|im_end|>\n<|im_start|>assistant\n"), False)
    t = Trajectory(id="long-0", group_id="long", env_id="bench/Long-v0", token_ids=ids, loss_mask=mask, logprobs=lps,
                   versions=vers, prompt_len=prompt_len, messages=msgs, rewards=rewards, reward=1.0, num_turns=turns)
    t.validate()
    return t


def list_rows(tok, rows: int, tokens: int, seed: int = 1):
    """``rows`` trajectories (in steps of 50) of about ``tokens`` tokens each."""
    rng = random.Random(seed)
    base = long_trajectory(tok, tokens * 4, turns=4, seed=seed)
    n = len(base.token_ids)
    for i in range(rows):
        cut = max(8, min(n, int(tokens * rng.uniform(0.5, 1.5))))
        t = Trajectory(id=f"t{i}", group_id=f"g{i // 8}", env_id=f"bench/Env{i % 3}-v0",
                       token_ids=base.token_ids[:cut], loss_mask=base.loss_mask[:cut], logprobs=base.logprobs[:cut],
                       versions=[v if v < 0 else (i // 50) - rng.randint(0, 2) for v in base.versions[:cut]],
                       prompt_len=base.prompt_len, messages=base.messages[:4], rewards=[rng.random()],
                       reward=rng.choice([0.0, 0.0, 1.0]), num_turns=rng.randint(1, 4),
                       termination=rng.choice(["terminated"] * 8 + ["truncated", "error"]))
        yield i // 50 + 2, t


class ViewServer:
    def __init__(self, path: Path, *extra: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", str(path), "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in self.proc.stdout:
            m = re.search(r"at (http://\S+/)", line)
            if m:
                self.url = m.group(1)
                return
        raise RuntimeError("agentrl view did not start")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=600) as r:
        return json.loads(r.read())


async def frames(page: Chromium) -> None:
    await page.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main_thread_cpu(page: Chromium) -> dict[str, float]:
    """The renderer main thread's CPU seconds so far: all tasks, script, layout and style."""
    m = {x["name"]: x["value"] for x in (await page.send("Performance.getMetrics"))["metrics"]}
    return {k: m[k] for k in ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration")}


async def bench_long(url: str, repeats: int, server_pid: int) -> dict[str, list[float]]:
    """Seconds from the user's action to the first screen drawn (header, legend, the first 6,000 tokens laid out
    and painted) and to every token drawn, opening from the list and by URL in a fresh tab; and, for the opening
    from the list, the CPU seconds it cost the server and the page's main thread (less sensitive to a busy machine
    than wall time)."""
    out: dict[str, list[float]] = {}

    async def open_(start) -> tuple[float, float]:
        t0 = time.perf_counter()
        await start()
        await page.wait_for("document.body.dataset.trajReady === '0'", timeout=120, interval=0.005)
        await frames(page)
        t1 = time.perf_counter()
        await page.wait_for("document.body.dataset.trajComplete === '0'", timeout=120, interval=0.005)
        await frames(page)
        return t1 - t0, time.perf_counter() - t0

    async with Chromium(width=1400, height=1000) as page:
        await page.send("Performance.enable", {"timeDomain": "threadTicks"})
        for _ in range(repeats):
            await page.navigate(url)
            await page.wait_for("document.body.dataset.listReady")
            c0, m0 = cpu_s(server_pid), await main_thread_cpu(page)
            first, full = await open_(lambda: page.evaluate("location.hash = '#/t/0'"))
            c1, m1 = cpu_s(server_pid), await main_thread_cpu(page)
            out.setdefault("from the list: first screen", []).append(first)
            out.setdefault("from the list: every token drawn", []).append(full)
            out.setdefault("cpu: server", []).append(c1 - c0)
            for k in m0:
                out.setdefault(f"cpu: page {k}", []).append(m1[k] - m0[k])
        out["spans"] = [float(await page.evaluate("document.querySelectorAll('#chat span.t').length"))]
        for _ in range(repeats):
            await page.navigate("about:blank")
            first, full = await open_(lambda: page.navigate(url + "#/t/0"))
            out.setdefault("by URL in a fresh tab: first screen", []).append(first)
            out.setdefault("by URL in a fresh tab: every token drawn", []).append(full)
    return out


async def bench_list(url: str, repeats: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"first page": [], "filtered + sorted page": [], "last page": []}
    targets = {"first page": "", "filtered + sorted page": "?env=bench%2FEnv1-v0&reward_min=0.5&staleness_min=1&sort=tokens&desc=1",
               "last page": "?page=999"}
    async with Chromium(width=1400, height=1000) as page:
        for _ in range(repeats):
            for name, hash_ in targets.items():
                await page.navigate("about:blank")
                t0 = time.perf_counter()
                await page.navigate(url + "#/" + hash_)
                await page.wait_for("document.body.dataset.listReady", timeout=600, interval=0.005)
                await frames(page)
                out[name].append(time.perf_counter() - t0)
        out["rows on the last page"] = [float(await page.evaluate("document.querySelectorAll('#list tbody tr').length"))]
    return out


def index_paths_s(path: Path, lines: int) -> tuple[float, float]:
    """Seconds to index the first ``lines`` lines in process: by the summary at each line's head (as written)
    and by parsing each line whole (the same records with another key order: the fallback path)."""
    from agentrl.viewer.data import TrajectoryIndex

    fast, full = path.with_name("sample-fast.jsonl"), path.with_name("sample-full.jsonl")
    with open(path, "rb") as src, open(fast, "wb") as f1, open(full, "wb") as f2:
        for i, line in enumerate(src):
            if i >= lines:
                break
            f1.write(line)
            rec = json.loads(line)
            f2.write((json.dumps({"trajectory": rec["trajectory"], "step": rec["step"]}) + "\n").encode())
    out = []
    for f in (fast, full):
        idx = TrajectoryIndex(f)
        t0 = time.perf_counter()
        idx.refresh()
        out.append(time.perf_counter() - t0)
        assert len(idx) == lines
    return out[0], out[1]


def screenshot(run: Path, out: Path, row: int | None, mode: str) -> None:
    srv = ViewServer(run)

    async def go() -> None:
        async with Chromium(width=1400, height=1050) as page:
            if row is None:
                await page.navigate(srv.url)
                await page.wait_for("document.body.dataset.listReady")
            else:
                await page.navigate(srv.url + f"#/t/{row}")
                await page.wait_for(f"document.body.dataset.trajComplete === '{row}'")
                await page.evaluate(f"""(() => {{ const s = document.getElementById('color-mode'); s.value = '{mode}';
                    s.dispatchEvent(new Event('change')); }})()""")
                await page.wait_for(f"document.body.dataset.modeReady === '{mode}'")
                # Hover a generated token on screen, as a user would, so the picture shows the tooltip.
                await page.evaluate("""(() => { const s = [...document.querySelectorAll('#chat .block.kind-assistant span.t')]
                    .filter(t => { const r = t.getBoundingClientRect();
                                   return r.top > 300 && r.bottom < innerHeight - 240 && t.textContent.trim(); });
                    const t = s[Math.floor(s.length / 2)]; if (!t) return; const r = t.getBoundingClientRect();
                    t.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
                    t.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: r.right, clientY: r.bottom})); })()""")
            await frames(page)
            await page.screenshot(out)

    try:
        asyncio.run(go())
    finally:
        srv.close()
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--long-tokens", type=int, default=65536)
    ap.add_argument("--list-rows", type=int, default=100_000, help="0 skips the list part")
    ap.add_argument("--list-tokens", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--screenshot-run", help="instead: screenshot this run directory's trajectory --row")
    ap.add_argument("--row", type=int, default=None, help="with --screenshot-run: the row to open (default: list)")
    ap.add_argument("--screenshot", default="docs/viewer.png")
    ap.add_argument("--mode", default="version", help="with --row: the token colouring (version, staleness, mask, "
                                                      "logprob, delta)")
    args = ap.parse_args()
    if args.screenshot_run:
        screenshot(Path(args.screenshot_run), Path(args.screenshot), args.row, args.mode)
        return

    tmp = tempfile.TemporaryDirectory(prefix="bench-viewer-") if not args.dir else None
    work = Path(args.dir or tmp.name)  # type: ignore[union-attr]
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    tok = tokenizer()
    long_dir, list_dir = work / "long", work / "list"
    long_dir.mkdir(parents=True, exist_ok=True)
    list_dir.mkdir(parents=True, exist_ok=True)
    t = long_trajectory(tok, args.long_tokens)
    log = TrajectoryLog(long_dir).open(0)
    log.write_trajectories(1, [t])
    rng = random.Random(2)
    log.write_logprobs(1, [{"trajectory_id": t.id, "version": 0,
                            "logprobs": [x + rng.gauss(0, 0.02) if m else -rng.expovariate(0.3)
                                         for x, m in zip(t.logprobs[1:], t.loss_mask[1:])]}])
    log.close()
    srv = ViewServer(long_dir)
    try:
        long = asyncio.run(bench_long(srv.url, args.repeats, srv.proc.pid))
    finally:
        srv.close()

    def cell(xs: list[float]) -> str:
        return f"{statistics.median(xs):.3f} s (max {max(xs):.3f})"

    rows_out = [f"| long trajectory | {len(t.token_ids):,} tokens, {t.num_turns} turns, "
                f"{int(long['spans'][0]):,} token spans drawn |"]
    rows_out += [f"| open the long trajectory {k} (median of {args.repeats}) | {cell(v)} |"
                 for k, v in long.items() if k != "spans" and not k.startswith("cpu")]
    cpu = {k: statistics.median(v) for k, v in long.items() if k.startswith("cpu")}
    rows_out.append(f"| CPU seconds of one opening from the list (median): server / page main thread (script, layout, "
                    f"style) | {cpu['cpu: server']:.2f} / {cpu['cpu: page TaskDuration']:.2f} "
                    f"({cpu['cpu: page ScriptDuration']:.2f}, {cpu['cpu: page LayoutDuration']:.2f}, "
                    f"{cpu['cpu: page RecalcStyleDuration']:.2f}) |")
    if args.list_rows:
        rows_out += bench_list_file(args, tok, list_dir, cell)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\nViewer benchmark ({os.cpu_count()} cores, load average before {' '.join(load0)}, after {' '.join(load1)})\n")
    print("| what | measured |\n| --- | --- |")
    print("\n".join(rows_out))
    if tmp is not None:
        tmp.cleanup()


def bench_list_file(args: argparse.Namespace, tok, list_dir: Path, cell) -> list[str]:
    t0 = time.perf_counter()
    log = TrajectoryLog(list_dir).open(0)
    batch, step_of = [], None
    for step, traj in list_rows(tok, args.list_rows, args.list_tokens):
        if step != step_of and batch:
            log.write_trajectories(step_of, batch)
            batch = []
        step_of = step
        batch.append(traj)
    log.write_trajectories(step_of, batch)
    log.close()
    write_s = time.perf_counter() - t0
    size_mb = (list_dir / "trajectories.jsonl").stat().st_size / 2**20

    srv = ViewServer(list_dir)
    try:
        t0 = time.perf_counter()
        run = get(srv.url + "api/run")
        index_s = time.perf_counter() - t0
        rss = srv.rss_mib()
        lst = asyncio.run(bench_list(srv.url, args.repeats))
        t0 = time.perf_counter()
        get(srv.url + "api/list?reward_min=0.5&sort=reward&desc=1&offset=50000&limit=100&text=t9")
        query_s = time.perf_counter() - t0
    finally:
        srv.close()
    sample = min(args.list_rows, 10_000)
    fast_s, full_s = index_paths_s(list_dir / "trajectories.jsonl", sample)
    out = [f"| list file | {run['rows']:,} trajectories, {size_mb:,.0f} MiB (written in {write_s:.0f} s by "
           "TrajectoryLog) |",
           f"| server start: index the list file (summary read from each line's head) | {index_s:.2f} s |",
           f"| index {sample:,} of those lines in process: summary at the line head / whole line parsed "
           f"(fallback) | {fast_s:.2f} s / {full_s:.2f} s ({full_s / fast_s:.1f}x) |",
           f"| server resident memory after indexing | {rss:.0f} MiB |"]
    out += [f"| list page load in a fresh tab, {k} (median of {args.repeats}) | {cell(lst[k])} |"
            for k in ("first page", "filtered + sorted page", "last page")]
    out.append(f"| API: filter + sort 100k rows, page at offset 50,000 | {query_s:.3f} s |")
    return out


if __name__ == "__main__":
    main()
