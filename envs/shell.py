"""``ShellEnv``: an episode in a sandbox of its own whose steps run real shell commands (the sandbox fleet's env).

Flow: ``reset`` takes a sandbox from the env's :class:`~agentrl.sandboxes.SandboxPool` (a fresh one, or one of the
pool's warm pool: the pool makes them ahead, see :meth:`agentrl.manager.EnvManager.sandbox_demand`), optionally
restored to a prepared work dir (``snapshot``), and opens with the task's goal. Each ``step`` runs the action as a
shell command in the work dir and returns its output (capped) and exit code as a ``tool`` message; the episode
ends (terminated, reward 1.0) when the output contains the task's ``expect`` string, or after ``max_turns`` steps
(truncated, reward 0.0). A command that fails is an ordinary observation (the agent's doing), and so is one no
sandbox can run (a NUL byte, over ``MAX_COMMAND_BYTES``: ``BadCommand``), answered ``error: ...`` with
``info["invalid_action"]``.

Infrastructure failures are raised, named (:mod:`agentrl.sandboxes.faults`): the sandbox lost (killed from outside,
its engine gone) or a command that hit its memory or disk limit raise a ``SandboxError`` with its
``failure_cause``, which the env manager counts and retries in a fresh env, hence a fresh sandbox
(``ManagerConfig.infra_retries``). ``aclose`` releases the sandbox (a dead one is stopped, never handed out again).

Task (``options["task"]``): ``{"goal": str, "expect": str}``; without one the goal is to print ``done``.
The pool is passed in (``pool=``, in-process envs) or is the process-wide one of :func:`shared_pool`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from agentrl.core import Env
from agentrl.sandboxes import BadCommand, SandboxError, SandboxPool, SandboxSpec, Snapshot, check_limits, infra_error

_POOL: SandboxPool | None = None


def shared_pool(**kwargs: Any) -> SandboxPool:
    """The process-wide pool of ShellEnvs made without one; ``kwargs`` (SandboxPool's) apply when it is made."""
    global _POOL
    if _POOL is None:
        _POOL = SandboxPool(**kwargs)
    return _POOL


class ShellEnv(Env):
    """Run shell commands in a sandbox until the output shows the task's ``expect`` (see the module docstring).

    pool: the SandboxPool sandboxes come from (default :func:`shared_pool`); spec: the sandbox (a SandboxSpec or
    its fields as a dict; default a bwrap busybox); snapshot: a prepared work dir restored into each episode's
    sandbox; max_turns: steps before truncation; output_chars: cap on one observation's output."""

    description = "Run shell commands in a sandbox until the output shows the expected text."

    def __init__(self, pool: SandboxPool | None = None, spec: SandboxSpec | dict | None = None,
                 snapshot: Snapshot | None = None, max_turns: int = 8, output_chars: int = 4096):
        super().__init__()
        if max_turns < 1:
            raise ValueError(f"ShellEnv max_turns must be >= 1, got {max_turns}")
        if output_chars < 1:
            raise ValueError(f"ShellEnv output_chars must be >= 1, got {output_chars}")
        if isinstance(spec, dict):
            spec = SandboxSpec(**spec)
        self.spec = spec if spec is not None else SandboxSpec(backend="bwrap", image="agentrl-busybox:latest")
        self.spec.validate()
        self.pool, self.snapshot = pool, snapshot
        self.max_turns, self.output_chars = max_turns, output_chars
        self.sandbox = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._expect = "done"
        self._turns = 0
        self.start_s: float | None = None

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await self.aclose()
        task = (options or {}).get("task") or {}
        if not isinstance(task, dict):
            raise ValueError(f"ShellEnv task must be a dict with 'goal' and 'expect', got {type(task).__name__}")
        self._expect = str(task.get("expect", "done"))
        goal = str(task.get("goal", "Print the word done."))
        self._turns = 0
        pool = self.pool if self.pool is not None else shared_pool()
        stack = contextlib.AsyncExitStack()
        t0 = time.monotonic()
        try:
            self.sandbox = await stack.enter_async_context(pool.acquire(self.spec, snapshot=self.snapshot))
        except SandboxError as e:
            await stack.aclose()
            raise await infra_error(e, self.spec.backend)
        self.start_s = time.monotonic() - t0  # from asking the pool to holding the sandbox
        self._stack = stack
        obs = [{"role": "system", "content": f"Each of your messages is run as a shell command in sandbox "
                                             f"{self.sandbox.id}, in {self.spec.workdir}; its output comes back."},
               {"role": "user", "content": goal}]
        return obs, {"sandbox_id": self.sandbox.id, "sandbox_start_s": self.start_s}

    async def astep(self, action: str):
        if self.sandbox is None:
            raise RuntimeError("ShellEnv: call reset before step")
        self._turns += 1
        sb = self.sandbox
        try:
            res = check_limits(await sb.exec(action, timeout=60, output_limit=self.output_chars), sb.id)
        except BadCommand as e:  # the action's fault (a NUL byte, too long): told to the model, the sandbox is fine
            msg = {"role": "tool", "name": "shell", "content": f"error: {e}"}
            truncated = self._turns >= self.max_turns
            return [msg], 0.0, False, truncated, {"invalid_action": True, "turn": self._turns,
                                                   "sandbox_start_s": self.start_s}
        except SandboxError as e:
            raise await infra_error(e, sb.backend)
        out = res.output[-self.output_chars:]
        done = self._expect in res.output
        msg = {"role": "tool", "name": "shell", "content": f"{out}\n[exit {res.exit_code}]"}
        truncated = not done and self._turns >= self.max_turns
        return [msg], 1.0 if done else 0.0, done, truncated, {"exit_code": res.exit_code, "turn": self._turns,
                                                              "sandbox_start_s": self.start_s}

    async def aclose(self) -> None:
        stack, self._stack, self.sandbox = self._stack, None, None
        if stack is not None:
            await stack.aclose()
