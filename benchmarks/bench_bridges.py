"""Per-step overhead of each bridge against the same work done natively, in one run.

Pairs (each side does the same work on the same seeds; what differs is the bridge):

- ``reasoning_gym``: ``reasoning_gym/leg_counting`` reset + answer step vs a native env of the same work (an agentrl
  env written by hand for that dataset: ``ds[i]``, ``extract_answer``, ``score_answer``, the same messages; in
  process; target <= 1.1x CPU).
- ``textarena``: ``textarena/GuessTheNumber-v0`` steps vs a native env of the same work (``textarena.make`` +
  ``reset`` + ``step`` + ``get_observation`` + ``close``; in process; target <= 1.1x CPU).
- ``mcp``: a ``lookup`` tool call through ``mcp/Tools-v0`` (parse, MCP client thread, stdio server, result) vs the
  MCP SDK's ``ClientSession.call_tool`` on one session to the same server (remote: round trip).
- ``outproc``: the count-down fixture env through the out-of-process host (system Python) vs the same class in
  this process (remote: the JSON-lines round trip).
- ``gem``: GEM's GuessTheNumber through the host in GEM's venv vs the same loop run bare inside that venv (its own
  timing, reported by a script run there).
- ``nemo_gym``: a ``/step`` through ``nemo_gym/Gymnasium-v0`` vs the same POST with ``urllib`` (stand-in server).
- ``openenv``: a step through ``openenv/Client-v0`` vs openenv-core's own ``GenericEnvClient`` on the echo env that
  ``openenv init`` writes, served by uvicorn (remote: the WebSocket round trip).

Figures: wall seconds per step and this process's CPU seconds per step (``time.process_time``, all threads), as the
median of ``--repeats`` alternating runs; the host's and servers' own CPU is not in the CPU column (the wall column
holds the round trip). The machine's load average is printed at start and end: on a shared machine, timings mean
little without it.

Run::

    nice -n 5 .venv/bin/python benchmarks/bench_bridges.py            # ~2-5 min
    nice -n 5 .venv/bin/python benchmarks/bench_bridges.py --steps 200 --repeats 3 --only reasoning_gym,mcp
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "envs" / "bridges"
SYSTEM_PYTHON = "/usr/bin/python3.11"


def timed(fn: Callable[[], int]) -> tuple[float, float]:
    """(wall s/step, CPU s/step) of ``fn``, which returns how many steps it did."""
    w0, c0 = time.perf_counter(), time.process_time()
    n = fn()
    return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def compare(name: str, bridge: Callable[[], int], bare: Callable[[], int] | None, repeats: int, kind: str,
            bare_timer: Callable[[], tuple[float, float]] | None = None) -> dict[str, Any]:
    """``bare_timer`` instead of ``bare``: a side that times itself (its set-up left out)."""
    measure_bare = bare_timer or (lambda: timed(bare))  # type: ignore[arg-type]
    bridge(), measure_bare()  # warm-up: imports, caches, servers started
    b, n = [], []
    for _ in range(repeats):
        b.append(timed(bridge))
        n.append(measure_bare())
    bw, bc = statistics.median(x[0] for x in b), statistics.median(x[1] for x in b)
    nw, nc = statistics.median(x[0] for x in n), statistics.median(x[1] for x in n)
    row = {"bridge": name, "kind": kind, "bridge_wall_ms": bw * 1e3, "bare_wall_ms": nw * 1e3,
           "bridge_cpu_ms": bc * 1e3, "bare_cpu_ms": nc * 1e3, "wall_ratio": bw / nw,
           "cpu_ratio": bc / nc if nc > 0 else float("nan"), "bridge_steps_per_s": 1 / bw}
    print(json.dumps(row), flush=True)
    return row


def play(env: Any, steps: int, action: Callable[[int], str]) -> int:
    """``steps`` steps of ``env`` (``action(n)`` for step ``n``), a new episode with the next seed (0, 1, ...) whenever
    one ends; returns ``steps``."""
    done, i = True, 0
    for n in range(steps):
        if done:
            env.reset(seed=i)
            i += 1
        _, _, term, trunc, _ = env.step(action(n))
        done = term or trunc
    return steps


# -- in-process bridges: against a native env of the same work ---------------------------------------------------
# The native envs are what a user would write by hand for one library: the same library calls and the same messages,
# without what the bridge adds (its global-RNG lock and swaps, content task keys, checks of the model's text).
def bench_reasoning_gym(steps: int, repeats: int) -> dict[str, Any]:
    import agentrl
    from agentrl.core import Env
    from reasoning_gym.utils import extract_answer

    # the env itself: the wrapper agentrl.make adds (the reset-before-step check) is the same for every env
    env = agentrl.make("reasoning_gym/leg_counting").unwrapped
    ds = env.dataset  # the same dataset object: both sides generate entries the same way
    answers = [ds[i % len(ds)]["answer"] for i in range(steps)]

    class NativeLegCounting(Env):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.entry = ds[seed % len(ds)]
            question = {"role": "user", "content": self.entry["question"]}
            return [{"role": "system", "content": env.system_prompt}, question], {}

        def step(self, action):
            reward = float(ds.score_answer(extract_answer(action), self.entry))
            return [{"role": "user", "content": f"Score {reward:g}."}], reward, True, False, {"correct": reward >= 1}

    native = NativeLegCounting()

    def run(e: Any) -> Callable[[], int]:
        def go() -> int:
            for i in range(steps):
                e.reset(seed=i)
                e.step(f"<answer>{answers[i]}</answer>")
            return steps
        return go

    row = compare("reasoning_gym/leg_counting", run(env), run(native), repeats, "in-process")
    return {**row, **in_rollout("reasoning_gym/leg_counting", NativeLegCounting,
                                lambda c, m: f"<answer>{ds[m.seed % len(ds)]['answer']}</answer>", steps, repeats)}


def bench_textarena(steps: int, repeats: int) -> dict[str, Any]:
    import agentrl
    import textarena
    from agentrl.core import Env

    env = agentrl.make("textarena/GuessTheNumber-v0").unwrapped
    guesses = ["[1]", "[2]", "[3]", "[4]", "[5]"]

    class NativeGuessTheNumber(Env):
        def _text(self) -> str:
            return "\n".join(str(text).strip() for _, text, *_ in self.game.get_observation()[1] or [])

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.game = textarena.make(env.make_id)
            self.game.reset(num_players=1, seed=seed)
            return [{"role": "user", "content": self._text()}], {}

        def step(self, action):
            done, _ = self.game.step(action)
            text, reward = self._text(), 0.0
            if done:
                reward = float(self.game.close()[0][0])
            return [{"role": "user", "content": text}], reward, done, False, {}

    native = NativeGuessTheNumber()

    def run(e: Any) -> Callable[[], int]:
        return lambda: play(e, steps, lambda n: guesses[n % len(guesses)])

    row = compare("textarena/GuessTheNumber-v0", run(env), run(native), repeats, "in-process")
    return {**row, **in_rollout("textarena/GuessTheNumber-v0", NativeGuessTheNumber,
                                lambda c, m: guesses[sum(x["role"] == "assistant" for x in c) % len(guesses)],
                                steps // 5, repeats)}


def in_rollout(env_id: str, native: Callable[[], Any], act: Callable[[list, Any], str], episodes: int,
               repeats: int) -> dict[str, Any]:
    """CPU per env step of ``episodes`` episodes run by the manager with a scripted policy (64 at once): the bridge's
    id against the native env registered under its own id; the manager's own per-step work is in both."""
    import agentrl
    from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
    from agentrl.policy import ScriptedPolicy

    native_id = "bench/native-" + env_id.replace("/", "-").replace(":", "-")
    if native_id not in agentrl.registered_ids("bench"):
        agentrl.register(native_id, entry_point=native)

    def run(eid: str) -> Callable[[], int]:
        async def go() -> int:
            async with EnvManager(ManagerConfig(max_concurrency=64, max_turns=16), ScriptedPolicy(act)) as mgr:
                trajs = await mgr.run_episodes([EpisodeSpec(eid, seed=i) for i in range(episodes)])
            assert all(t.termination != "error" for t in trajs), [t.info for t in trajs if t.termination == "error"][:1]
            return sum(t.num_turns for t in trajs)
        return lambda: asyncio.run(go())

    row = compare(env_id + " (in a rollout)", run(env_id), run(native_id), repeats, "in-process")
    return {"rollout_" + k: v for k, v in row.items() if k not in ("bridge", "kind")}


# -- remote bridges ----------------------------------------------------------------------------------------------
def bench_mcp(steps: int, repeats: int) -> dict[str, Any]:
    import agentrl
    from agentrl.envs.bridges.mcp_tools import DEMO_SERVER
    from agentrl.tools import format_tool_call
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = agentrl.make("mcp/Tools-v0")
    env.reset(seed=0)
    call = format_tool_call("lookup", {"name": "Ann"})

    def bridge() -> int:
        for _ in range(steps):
            env.step(call)
        return steps

    def bare_timer() -> tuple[float, float]:
        """One SDK session (started and initialized outside the timing), ``steps`` calls timed."""
        async def run() -> tuple[float, float]:
            params = StdioServerParameters(command=sys.executable, args=[str(DEMO_SERVER)])
            with open(os.devnull, "w") as errlog:
                async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as session:
                    await session.initialize()
                    await session.call_tool("lookup", {"name": "Ann"})
                    w0, c0 = time.perf_counter(), time.process_time()
                    for _ in range(steps):
                        await session.call_tool("lookup", {"name": "Ann"})
                    return (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps
        return asyncio.run(run())

    try:
        return compare("mcp/Tools-v0 (stdio demo server)", bridge, None, repeats, "remote", bare_timer=bare_timer)
    finally:
        env.close()


def bench_outproc(steps: int, repeats: int) -> dict[str, Any]:
    import agentrl

    sys.path.insert(0, str(TESTS))
    import outproc_fixture_env

    env = agentrl.make("outproc/Env-v0", python=SYSTEM_PYTHON, factory="outproc_fixture_env:make",
                       pythonpath=[str(TESTS)])
    env.reset(seed=0)
    local = outproc_fixture_env.make()
    devnull = open(os.devnull, "w")
    real_stdout, fd1 = sys.stdout, os.dup(1)
    local.reset(seed=0)

    def bridge() -> int:
        for _ in range(steps):
            env.step("wait")
        return steps

    def bare() -> int:  # the fixture prints on every step: to /dev/null on both sides (the host sends it to stderr)
        sys.stdout = devnull
        try:
            for _ in range(steps):
                local.step("wait")
        finally:
            sys.stdout = real_stdout
        return steps

    try:
        return compare("outproc/Env-v0 (system Python host)", bridge, bare, repeats, "remote")
    finally:
        env.close()
        os.close(fd1)


GEM_BARE = r"""
import json, sys, time, gem
steps = int(sys.argv[1])
env = gem.make("game:GuessTheNumber-v0-easy")
def run():
    done, i, n = True, 0, 0
    while n < steps:
        if done:
            env.reset(seed=i); i += 1
        _, _, term, trunc, _ = env.step("\\boxed{%d}" % (n % 4 + 1))
        done, n = term or trunc, n + 1
run()
w0, c0 = time.perf_counter(), time.process_time(); run()
print(json.dumps([(time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps]))
"""


def bench_gem(steps: int, repeats: int) -> dict[str, Any]:
    import agentrl
    from agentrl.envs.bridges.gem_env import gem_python

    env = agentrl.make("gem/game:GuessTheNumber-v0-easy")

    def bridge() -> int:
        return play(env, steps, lambda n: "\\boxed{%d}" % (n % 4 + 1))

    bridge()
    b = [timed(bridge) for _ in range(repeats)]
    env.close()
    bare = [json.loads(subprocess.run([str(gem_python()), "-c", GEM_BARE, str(steps)], capture_output=True,
                                      text=True, check=True).stdout.strip().splitlines()[-1]) for _ in range(repeats)]
    bw, bc = statistics.median(x[0] for x in b), statistics.median(x[1] for x in b)
    nw, nc = statistics.median(x[0] for x in bare), statistics.median(x[1] for x in bare)
    row = {"bridge": "gem/game:GuessTheNumber-v0-easy (GEM venv host)", "kind": "remote",
           "bridge_wall_ms": bw * 1e3, "bare_wall_ms": nw * 1e3, "bridge_cpu_ms": bc * 1e3,
           "bare_cpu_ms": nc * 1e3, "wall_ratio": bw / nw, "cpu_ratio": float("nan"), "bridge_steps_per_s": 1 / bw}
    print(json.dumps(row), flush=True)
    return row


def start_server(argv: Callable[[int], list[str]], cwd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Starts ``argv(port)`` on a free loopback port and waits (up to a minute) until it accepts connections."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(argv(port), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def bench_nemo_gym(steps: int, repeats: int, tmp: Path) -> dict[str, Any]:
    import http.cookiejar
    import urllib.request

    import agentrl
    from agentrl.envs.bridges.nemo_gym_client import response_object

    proc, url = start_server(lambda port: [sys.executable, str(TESTS / "nemo_gym_standin.py"), str(port)])
    row_data = {"responses_create_params": {"input": "Guess."}, "secret": 9}  # never guessed: episodes run on
    rows = tmp / "nemo_rows.jsonl"
    rows.write_text(json.dumps(row_data) + "\n")
    env = agentrl.make("nemo_gym/Gymnasium-v0", url=url, tasks=str(rows))
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def post(path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with opener.open(req, timeout=60) as r:
            return json.loads(r.read())

    def bridge() -> int:  # 4 guesses per episode (the stand-in's limit): reset + 4 steps
        n = 0
        while n < steps:
            env.reset(seed=0)
            for _ in range(4):
                env.step("<action>1</action>")
                n += 1
        return n

    def bare() -> int:
        n = 0
        while n < steps:
            post("/reset", row_data)
            for _ in range(4):
                post("/step", {**row_data, "response": response_object("<action>1</action>")})
                n += 1
        return n

    try:
        return compare("nemo_gym/Gymnasium-v0 (stand-in server)", bridge, bare, repeats, "remote")
    finally:
        env.close()
        proc.kill()
        proc.wait()


def bench_openenv(steps: int, repeats: int, tmp: Path) -> dict[str, Any]:
    """The echo env that ``openenv init`` writes, served by uvicorn on loopback (one session at a time): a step
    through ``openenv/Client-v0`` against the same step through openenv-core's own ``GenericEnvClient`` (its sync
    wrapper over the WebSocket session), each side opening its session, resetting and stepping."""
    import agentrl
    from openenv.core import GenericEnvClient

    init = subprocess.run([str(Path(sys.executable).parent / "openenv"), "init", "echo_env"], cwd=tmp,
                          capture_output=True, text=True, timeout=120)
    if init.returncode != 0:
        raise RuntimeError(f"openenv init failed: {init.stdout}{init.stderr}")
    proc, url = start_server(lambda port: [sys.executable, "-m", "uvicorn", "server.app:app", "--host", "127.0.0.1",
                                           "--port", str(port), "--log-level", "warning"], cwd=tmp / "echo_env")

    def bridge() -> int:
        env = agentrl.make("openenv/Client-v0", url=url)
        try:
            env.reset(seed=0)
            for _ in range(steps):
                env.step("hello there")
        finally:
            env.close()
        return steps

    def bare() -> int:
        with GenericEnvClient(base_url=url).sync() as client:
            client.reset(seed=0)
            for _ in range(steps):
                client.step({"message": "hello there"})
        return steps

    try:
        return compare("openenv/Client-v0 (echo template, uvicorn)", bridge, bare, repeats, "remote")
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400, help="steps per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs of each side (median)")
    ap.add_argument("--only", default="", help="comma-separated subset of: reasoning_gym,textarena,mcp,outproc,gem,nemo_gym,openenv")
    ap.add_argument("--out", default="", help="also write the rows as JSON here")
    args = ap.parse_args()
    import tempfile

    print(json.dumps({"loadavg_start": os.getloadavg()}), flush=True)
    only = set(filter(None, args.only.split(",")))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("reasoning_gym", bench_reasoning_gym), ("textarena", bench_textarena), ("mcp", bench_mcp),
                         ("outproc", bench_outproc), ("gem", bench_gem),
                         ("nemo_gym", lambda s, r: bench_nemo_gym(s, r, Path(tmp))),
                         ("openenv", lambda s, r: bench_openenv(s, r, Path(tmp)))):
            if not only or name in only:
                rows.append(fn(args.steps, args.repeats))
    end = os.getloadavg()
    print(json.dumps({"loadavg_end": end}), flush=True)
    print("\n| bridge | kind | bridge ms/step (wall) | bare ms/step (wall) | wall x | bridge CPU ms/step | bare CPU ms/step | CPU x |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['bridge']} | {r['kind']} | {r['bridge_wall_ms']:.3f} | {r['bare_wall_ms']:.3f} | "
              f"{r['wall_ratio']:.2f} | {r['bridge_cpu_ms']:.3f} | {r['bare_cpu_ms']:.3f} | {r['cpu_ratio']:.2f} |")
    rollout = [r for r in rows if "rollout_cpu_ratio" in r]
    if rollout:
        print("\nIn a rollout (the manager and a scripted policy, 64 episodes at once):\n")
        print("| bridge | bridge CPU ms/step | native CPU ms/step | CPU x | bridge steps/s |")
        print("|---|---|---|---|---|")
        for r in rollout:
            print(f"| {r['bridge']} | {r['rollout_bridge_cpu_ms']:.3f} | {r['rollout_bare_cpu_ms']:.3f} | "
                  f"{r['rollout_cpu_ratio']:.2f} | {r['rollout_bridge_steps_per_s']:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "loadavg_end": end}, indent=2))


if __name__ == "__main__":
    main()
