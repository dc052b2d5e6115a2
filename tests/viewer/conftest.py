"""Fixtures for the viewer tests.

``run_dir`` (session) is a run directory built the way a training run builds it, without an engine: real episodes
of the real envs through the real manager and agent-loop token path (the scripted solver with noise stands in for
the model, as in the warm start), trained by the real :class:`Trainer` on the tiny model with ``record_logprobs``,
written by the real writers (:class:`TrajectoryLog`, ``RunFiles.append_metrics``) next to a real checkpoint (whose
``model/`` carries the tokenizer the viewer finds). The pipeline test checks that ``agentrl train`` writes the same
files. ``view`` starts the real ``agentrl view`` command."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.controller.run import RunFiles
from agentrl.controller.runlog import TrajectoryLog

ENVS = {  # the trainer samples the trajectories it records: the fixture records all 12 of a step
    "agentrl/ToolUse-v0": ({}, ['<tool_call>{"name": "lookup", "arguments": {"name": "Zed"}}</tool_call>',
                               '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>',
                               "<answer>7</answer>"]),
    "agentrl/FrozenLake-v0": (dict(size=3, hole_prob=0.2),
                              ["<answer>up</answer>", "<answer>down</answer>", "<answer>left</answer>"]),
}


async def episodes(tokenizer, env_id: str, groups: int, group_size: int, seed0: int, noise: float = 0.5):
    from agentrl.envs import solver_for
    from agentrl.agent.loop import RolloutConfig
    from agentrl.controller.warmstart import DemoPolicy, noisy

    kwargs, actions = ENVS[env_id]
    policy = DemoPolicy(noisy(solver_for(env_id), actions, noise, seed=seed0), tokenizer,
                        RolloutConfig(max_tokens_per_turn=64, max_turns=6, max_context_tokens=1024))
    cfg = ManagerConfig(workers=0, max_turns=6, max_concurrency=64, num_groups=groups, group_size=group_size)
    specs = [EpisodeSpec(env_id, env_kwargs=dict(kwargs), seed=seed0 + g, group_id=f"{env_id.split('/')[1]}-s{seed0 + g}")
             for g in range(groups)]
    async with EnvManager(cfg, policy) as mgr:
        return await mgr.collect_groups(iter(specs))


def build_run_dir(root: Path, steps: int = 2, record: int = 12) -> Path:
    """Writes ``steps`` training steps into ``root`` and returns it."""
    from transformers import AutoTokenizer

    from agentrl.models import ensure_tiny_model
    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.trainer import Trainer

    import torch

    model = ensure_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 0.5M-parameter model: more threads only contend on a busy machine
    trainer = Trainer(TrainerConfig(device="cpu", record_logprobs=record, micro_batch_size=16), model)
    files = RunFiles(root)
    root.mkdir(parents=True, exist_ok=True)
    tlog = TrajectoryLog(root).open(0)
    try:
        for step in range(steps):
            groups = []
            for env_id in ENVS:
                groups += asyncio.run(episodes(tokenizer, env_id, groups=2, group_size=3, seed0=100 * step))
            metrics = trainer.train_step(groups)
            trajs = [t for g in groups for t in g.trajectories]
            tlog.write_trajectories(step + 1, trajs)
            tlog.write_logprobs(step + 1, trainer.take_logprob_records())
            row = {"step": step + 1, **{f"train/{k}": v for k, v in metrics.items()},
                   "reward": sum(t.reward for t in trajs) / len(trajs)}
            files.append_metrics(row)
    finally:
        tlog.close()
        torch.set_num_threads(threads)
    # The checkpoint's model/ carries the tokenizer: the viewer finds it there, as in a real run directory.
    trainer.save_checkpoint(files.checkpoint_dir(steps))
    return root


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst




@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory of 2 steps x 12 trajectories (FrozenLake and ToolUse, 2 groups of 3 each), all recorded."""
    return build_run_dir(tmp_path_factory.mktemp("viewer") / "run")


@pytest.fixture
def run_copy(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of ``run_dir`` that the test may change."""
    return copy_run(run_dir, tmp_path / "run")


class ViewProcess:
    """``agentrl view PATH --port 0`` in a subprocess (the real command); ``url`` is the page it serves."""

    def __init__(self, path: Path, *extra: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", str(path), "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        deadline = time.time() + 120
        self.url = ""
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            m = re.search(r"at (http://\S+/)", line)
            if m:
                self.url = m.group(1)
                return
        self.close()
        raise RuntimeError("agentrl view did not start: " + "".join(self.lines)[-3000:])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def view():
    """Starts ``agentrl view`` on a path; every process started is stopped at the end of the test."""
    procs: list[ViewProcess] = []

    def start(path: Path, *extra: str) -> ViewProcess:
        procs.append(ViewProcess(path, *extra))
        return procs[-1]

    yield start
    for p in procs:
        p.close()
