"""A sandbox fleet under the env manager, for tests and ``benchmarks/bench_fleet.py``: episodes of
:class:`agentrl.envs.shell.ShellEnv` driven by :class:`FleetPolicy`, which runs real commands and injects the
infrastructure faults the manager must survive, each made to happen, not hoped for:

- ``kill``: the first command runs ``sleep`` and the policy kills the sandbox from outside once that command is seen
  running (bwrap: every process of the sandbox's cgroup, as the OOM killer or an operator would; docker:
  ``docker kill``);
- ``oom``: the command allocates past the sandbox's memory limit (busybox ``dd`` with a 64 MiB block);
- ``disk``: the command writes 8 MB into the work dir (fill a ``workdir_size_mb`` below that);
- ``hold``: the first command blocks (``sleep``) until the test or benchmark kills what it runs on.

Only an episode's first attempt (trajectory id ending in ``.0``) plays its fault; its retries run ``steps`` ordinary
commands (a shell loop of ``loop`` iterations each, the step's own cost) and end with ``echo done``. ``hold`` is the
exception: it is played until the task's hold was seen running, so that an attempt lost to an unrelated
infrastructure failure before that (retried by the manager, as it should be) does not leave the waiter one hold short.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from typing import Any

from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession

STEP = "i=0; while [ $i -lt {n} ]; do i=$((i+1)); done; echo step-{k}"
FAULTS = {
    "oom": "dd if=/dev/zero of=/dev/null bs=64M count=1",
    "disk": "head -c 8000000 /dev/zero > big",
    "kill": "sleep 300 # fleet-victim",
    "hold": "sleep 300 # fleet-hold",
}
_SANDBOX_ID = re.compile(r"sandbox ([\w.-]+),")


def kill_from_outside(sb: Any) -> None:
    """Kills ``sb`` the way the host would (see the module docstring)."""
    if sb.backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        docker_client().api.kill(sb.container_id)
        return
    for pid in (sb.cgroup.pids() if sb.cgroup is not None else [p.pid for p in sb._procs]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def running(sb: Any, needle: str, seen: list[str] | None = None) -> bool:
    """Whether a process of ``sb`` has ``needle`` on its command line (bwrap: through its cgroup; docker: the
    container's processes as the engine lists them). ``seen`` (if given) gets what was looked at instead: the
    engine's error or the command lines listed, for the message of a wait that runs out."""
    if sb.backend == "docker":
        from agentrl.sandboxes.docker import docker_client

        try:
            # -ww: the engine's ps would cut command lines at its terminal width ($COLUMNS)
            top = docker_client().api.top(sb.container_id, ps_args="-ef -ww")
        except Exception as e:
            if seen is not None:
                seen[:] = [f"docker top: {type(e).__name__}: {e}"]
            return False
        lines = [" ".join(map(str, p)) for p in top.get("Processes") or []]
        if seen is not None:
            seen[:] = lines
        return any(needle in line for line in lines)
    for pid in sb.cgroup.pids() if sb.cgroup is not None else []:
        try:
            if needle in open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace"):
                return True
        except OSError:
            continue
    return False


async def until_running(sb: Any, needle: str, timeout: float = 240.0) -> None:
    deadline, seen = time.monotonic() + timeout, []
    while not await asyncio.to_thread(running, sb, needle, seen):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no process {needle!r} in sandbox {sb.id} after {timeout} s; last seen: {seen[-8:]}")
        await asyncio.sleep(0.05)


class FleetPolicy(Policy):
    """Plays ``meta.task["fault"]`` (None, "kill", "oom", "disk", "hold") on an episode's first attempt, then
    ``steps`` commands and ``echo done``. ``sandboxes`` maps sandbox ids to the pool's sandboxes (the test's or
    benchmark's pool factory fills it) so that ``kill`` can find its victim. ``holding`` is set once ``hold_count``
    tasks' ``hold`` commands were seen running, or as soon as something makes that impossible: a background watch
    failed, or a hold command returned before it was seen (the error is then in ``job_errors``: a waiter checks it
    instead of waiting out its own timeout). ``kills`` counts the kills that landed. ``barrier``: first attempts
    wait at their first action until that many arrived (the whole fleet alive at once; ``all_up_at`` is when)."""

    def __init__(self, sandboxes: dict[str, Any], steps: int = 2, loop: int = 100, hold_count: int = 0,
                 barrier: int = 0):
        self.sandboxes, self.steps, self.loop = sandboxes, steps, loop
        self.barrier = barrier  # first attempts wait at their first action until this many got there
        self.arrived = 0
        self.all_up = asyncio.Event()
        self.all_up_at: float | None = None
        self.barrier_timeout_s = 900.0
        self.barrier_broken = False
        if barrier == 0:
            self.all_up.set()
        self.kills = 0
        self.held = 0
        self.hold_count = hold_count
        self.holding = asyncio.Event()
        if hold_count == 0:
            self.holding.set()
        self._tasks: set[asyncio.Task] = set()
        self._held: set[str] = set()  # tasks (trajectory id less its attempt number) whose hold was seen running
        self.job_errors: list[str] = []  # background watches (kill, hold) that failed, with why
        self.current_version = 0  # a training run's driver moves it with the trainer's version

    @property
    def version(self) -> int:
        return self.current_version

    def session(self, meta: EpisodeMeta) -> PolicySession:
        return _FleetSession(self, meta)

    def _job_done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            self._error(f"{type(t.exception()).__name__}: {t.exception()}")

    def _error(self, what: str) -> None:
        self.job_errors.append(what)
        self.holding.set()  # wake the waiter now, with the cause, not at its own timeout

    async def _kill_when_running(self, sb: Any) -> None:
        await until_running(sb, "fleet-victim")
        kill_from_outside(sb)
        self.kills += 1

    async def _count_hold(self, sb: Any, task: str = "") -> None:
        await until_running(sb, "fleet-hold")
        if task in self._held:
            return
        self._held.add(task)
        self.held += 1
        if self.held >= self.hold_count:
            self.holding.set()


class _FleetSession(PolicySession):
    def __init__(self, p: FleetPolicy, meta: EpisodeMeta):
        self.p, self.meta, self.turn = p, meta, 0
        task = meta.task if isinstance(meta.task, dict) else {}
        self.first = meta.trajectory_id.endswith(".0")
        self.key = meta.trajectory_id.rpartition(".")[0]
        fault = task.get("fault")
        self.fault = fault if self.first or (fault == "hold" and self.key not in p._held) else None
        self.sandbox = None
        self.watch: asyncio.Task | None = None

    async def act(self, new_messages: list[dict]) -> Action:
        if self.sandbox is None:
            m = _SANDBOX_ID.search(" ".join(str(x.get("content", "")) for x in new_messages))
            self.sandbox = self.p.sandboxes.get(m.group(1)) if m else None
        self.turn += 1
        if self.turn == 1 and self.first and not self.p.all_up.is_set():
            self.p.arrived += 1  # this episode's sandbox is alive: wait for the whole fleet to be
            if self.p.arrived >= self.p.barrier:
                self.p.all_up_at = time.monotonic()
                self.p.all_up.set()
            try:  # a first attempt that failed before its first action never arrives: go on after a while
                await asyncio.wait_for(self.p.all_up.wait(), self.p.barrier_timeout_s)
            except asyncio.TimeoutError:
                self.p.barrier_broken = True
                self.p.all_up.set()
        if self.turn == 1 and self.fault:
            if self.fault in ("kill", "hold"):
                assert self.sandbox is not None, "FleetPolicy: the sandbox of this episode is not known"
                job = (self.p._kill_when_running(self.sandbox) if self.fault == "kill"
                       else self.p._count_hold(self.sandbox, self.key))
                self.watch = t = asyncio.ensure_future(job)
                self.p._tasks.add(t)
                t.add_done_callback(self.p._job_done)
            return Action(FAULTS[self.fault])
        if self.turn == 2 and self.fault == "hold" and self.key not in self.p._held:
            said = " ".join(str(x.get("content", "")) for x in new_messages)[-300:]
            self.p._error(f"{self.meta.trajectory_id}: the hold command returned before it was seen running: {said!r}")
        if self.turn <= self.p.steps:
            return Action(STEP.format(n=self.p.loop, k=self.turn))
        return Action("echo done")

    async def aclose(self) -> None:
        # an ended attempt's watch would poll a sandbox that is gone until its own timeout
        if self.watch is not None and not self.watch.done():
            self.watch.cancel()
