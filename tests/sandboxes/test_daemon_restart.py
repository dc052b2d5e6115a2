"""The docker daemon restarted mid-run, on a private dockerd of the test's own (its own socket, data root and exec
root, no bridge, no iptables: other users of the machine's engine are untouched), under the env manager.

Made to happen, in order: every episode's sandbox runs a command (seen running), then the daemon is stopped (its
containers die with it); every episode ends as an infrastructure failure named ``sandbox_engine``; only then the
daemon is started again, and the retries (held at the pool's factory while it is down, so that the order is the
test's, not the clock's) run in fresh sandboxes on the restarted daemon. Every task is delivered once, nothing of the
run is left on the daemon or the host, and the driver returns. (An attempt lost before the stop, to a slow exec start
on a loaded machine, is the manager's ordinary retry: the retry holds in its place, and what the stop causes is
counted from the moment every task holds.) A second test leaves the daemon down: every episode
ends failed with that cause after its bounded retries, and the driver returns.

Needs root, ``dockerd`` and the busybox rootfs (``agentrl sandboxes build-image --busybox``): skipped on a developer
machine without them, FAILED in CI (``CI=true``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.sandboxes import SandboxPool, SandboxSpec, create_sandbox, rootfs_path
from agentrl.sandboxes import docker_engine
from agentrl.sandboxes.base import LABEL_RUN
from agentrl.testing.fleet import FleetPolicy

from .conftest import BUSYBOX, TEST_RUN, unavailable

N = 16
SHELL = "agentrl.envs.shell:ShellEnv"


def namespace(name: str) -> str:
    """``name`` as a containerd namespace: alphanumerics joined by single separators. A tempdir name holds "_"
    anywhere, and "agentrl-dk-_b6279zv" made every container start fail ("namespace validation") in CI."""
    return "agentrl" + "".join(ch for ch in name if ch.isascii() and ch.isalnum())


def test_namespaces_made_from_any_tempdir_name_are_valid_for_containerd():
    import re

    valid = re.compile(r"[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*\Z")  # containerd's identifier rule
    for name in ("agentrl-dk-_b6279zv", "agentrl-dk-ab__cd", "agentrl-dk-abcd_", "agentrl-dk-a_b-c"):
        assert valid.match(namespace(name)) and valid.match(namespace(name) + "-p"), name
    assert namespace("agentrl-dk-_b6279zv") != namespace("agentrl-dk-_f90mqmp")


class PrivateDockerd:
    """A dockerd of this test only; ``start()`` / ``stop()`` may be repeated (the data root stays)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="agentrl-dk-", dir="/tmp"))  # short: a unix socket path
        self.sock = self.dir / "docker.sock"
        self.host = f"unix://{self.sock}"
        self.log = open(self.dir / "dockerd.log", "ab")
        self.proc: subprocess.Popen | None = None
        tag = namespace(self.dir.name)
        self.argv = ["dockerd", "--host", self.host, "--data-root", str(self.dir / "data"),
                     "--exec-root", str(self.dir / "exec"), "--pidfile", str(self.dir / "dockerd.pid"),
                     "--bridge=none", "--iptables=false", "--ip6tables=false", "--shutdown-timeout", "2",
                     "--containerd-namespace", tag, "--containerd-plugins-namespace", f"{tag}-p"]

    def log_tail(self, n: int = 3000) -> str:
        return (self.dir / "dockerd.log").read_bytes()[-n:].decode(errors="replace")

    def answering(self) -> bool:
        import docker

        try:
            client = docker.DockerClient(base_url=self.host, timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    def start(self, wait_s: float = 180.0, starts: int = 4) -> None:
        """Starts the daemon and waits until it answers. dockerd gives up on its containerd after a fixed 15 s and
        exits (CI saw it on a loaded machine): such a daemon is started again, up to ``starts`` times; the next start
        reuses the containerd the last one left starting."""
        deadline = time.monotonic() + wait_s
        for _ in range(starts):
            self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
            while not self.answering():
                if self.proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"private dockerd did not answer within {wait_s:.0f}s:\n{self.log_tail()}")
                time.sleep(0.1)
            else:
                return
        self.proc = None
        raise RuntimeError(f"private dockerd exited {starts} times before it answered:\n{self.log_tail()}")

    def runs_containers(self, wait_s: float = 120.0) -> None:
        """Waits until the daemon runs a container of the test's image: answering its API is not enough (its
        containerd may still be starting, or be restarted by the daemon's health check on a loaded machine, and
        every create fails meanwhile); else RuntimeError with the last error and the log's tail."""
        import docker

        deadline = time.monotonic() + wait_s
        client = docker.DockerClient(base_url=self.host, timeout=60)
        try:
            while True:
                try:
                    client.containers.run(BUSYBOX, ["true"], entrypoint=[""], remove=True, network_mode="none")
                    return
                except Exception as e:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"private dockerd ran no container within {wait_s:.0f}s: "
                                           f"{type(e).__name__}: {e}\n{self.log_tail()}") from e
                    time.sleep(0.5)
        finally:
            client.close()

    def stop(self) -> None:
        """SIGTERM (what ``systemctl restart docker`` sends), then wait for the daemon to exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def processes(self) -> list[int]:
        """Processes of this daemon still running (its containerd, shims), found by the paths on their command
        line."""
        out = []
        for p in Path("/proc").glob("[0-9]*"):
            try:
                if str(self.dir).encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
        return out

    def remove(self) -> None:
        self.stop()
        self.log.close()
        deadline = time.monotonic() + 30
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.1)  # containerd leaves after dockerd
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # the data root may hold overlay mounts of a daemon that died hard: unmount before removing
        subprocess.run(f"grep -o ' {self.dir}[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l",
                       shell=True, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def dockerd(monkeypatch):
    if os.geteuid() != 0:
        unavailable("a private dockerd needs root")
    if shutil.which("dockerd") is None:
        unavailable("dockerd not installed (apt-get install docker.io)")
    if not rootfs_path(BUSYBOX).is_dir():
        unavailable(f"rootfs for {BUSYBOX} missing: run `agentrl sandboxes build-image --busybox`")
    d = PrivateDockerd()
    try:
        d.start()
    except RuntimeError as e:
        d.remove()
        unavailable(str(e))
    monkeypatch.setenv("DOCKER_HOST", d.host)
    monkeypatch.setattr(docker_engine, "_CLIENT", None)  # the process-wide client, now on the private daemon
    try:
        from agentrl.sandboxes.build import import_rootfs

        import_rootfs(rootfs_path(BUSYBOX), BUSYBOX, log=lambda *_: None)
        d.runs_containers()
        yield d
    finally:
        client = docker_engine._CLIENT
        if client is not None:
            client.close()
        monkeypatch.setattr(docker_engine, "_CLIENT", None)
        d.remove()


def run_containers(d: PrivateDockerd) -> list[str]:
    import docker

    client = docker.DockerClient(base_url=d.host, timeout=30)
    try:
        return [c["Id"][:12] for c in client.api.containers(all=True, filters={"label": f"{LABEL_RUN}={TEST_RUN}"})]
    finally:
        client.close()


def host_leftovers(made: dict) -> list[str]:
    """Exec cgroups the driver made under the containers' cgroups, still on the host."""
    left = []
    for sb in made.values():
        groups = getattr(sb, "groups", None)
        for d in getattr(groups, "dirs", None) or []:
            if Path(d).exists():
                left.append(str(d))
    return left


async def until(cond, what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.05)


async def all_holding(policy: FleetPolicy, m: EnvManager, run: asyncio.Future, dockerd: PrivateDockerd,
                      timeout: float = 300.0) -> None:
    """Every task's hold command seen running; else the reason: the policy's, the manager's counts, the errors of
    a run that ended first (every attempt failed), and the daemon's last log lines."""
    held = asyncio.ensure_future(policy.holding.wait())
    try:
        await asyncio.wait([held, run], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        held.cancel()
    if policy.holding.is_set():
        assert policy.job_errors == [], (policy.job_errors, m.metrics())
        return
    seen = f"{policy.held}/{policy.hold_count} holds seen"
    if run.done():
        errors = [t.error for t in run.result() if t.error] if run.exception() is None else [repr(run.exception())]
        kinds = sorted({e.splitlines()[0] for e in errors})
        seen += f"; the run ended first, its errors: {kinds[:5]}; the first in full:\n{errors[0] if errors else ''}"
    else:
        seen += f" in {timeout:.0f} s"
    raise AssertionError(f"{seen}; {m.metrics()}; dockerd log:\n{dockerd.log_tail()}")


INFRA = ("sandbox_lost", "sandbox_engine", "sandbox_oom", "sandbox_disk")


async def test_daemon_restart_mid_run_every_episode_is_retried_and_nothing_is_left(dockerd):
    spec = SandboxSpec(backend="docker", image=BUSYBOX, memory_mb=32, pids=32, ttl_s=600)
    made: dict = {}
    engine_up = asyncio.Event()
    engine_up.set()

    async def factory(s):
        await engine_up.wait()  # retries wait for the restarted daemon (the test orders the events)
        sb = await create_sandbox(s).start()
        made[sb.id] = sb
        return sb

    # retries: a create that fails on a loaded machine before the stop is not what this test is about
    pool = SandboxPool(factory=factory, max_alive=N, create_rate=50, create_burst=N, retries=6)
    policy = FleetPolicy(made, steps=1, hold_count=N)
    specs = [EpisodeSpec(SHELL, {"pool": pool, "spec": spec}, seed=i, task={"fault": "hold", "expect": "done"})
             for i in range(N)]
    cfg = ManagerConfig(max_concurrency=N, infra_retries=2, max_failures_per_group=0, step_timeout_s=120,
                        reset_timeout_s=300)
    try:
        async with EnvManager(cfg, policy) as m:
            run = asyncio.ensure_future(m.run_episodes(specs))
            await all_holding(policy, m, run, dockerd)  # every task's command is running
            # an attempt lost before that (a slow exec start on a loaded machine) was retried, as it should be:
            # what the stop causes is counted from here
            before = m.metrics()
            engine_up.clear()
            t0 = time.monotonic()
            await asyncio.to_thread(dockerd.stop)
            await until(lambda: m.counts["failed"] - before["failed"] >= N, "every episode ended as a failure")
            failed_s = time.monotonic() - t0
            await asyncio.to_thread(dockerd.start)
            await asyncio.to_thread(dockerd.runs_containers)
            engine_up.set()
            trajs = await asyncio.wait_for(run, 600)  # the driver never hangs
            met = m.metrics()
    finally:
        await pool.close()
    assert failed_s < 60, failed_s
    assert [t.termination for t in trajs] == ["terminated"] * N, [t.error for t in trajs if t.error][:3]
    assert len({t.id.rpartition(".")[0] for t in trajs}) == N  # every task delivered once, each after a retry:
    assert all(int(t.id.rpartition(".")[2]) >= 1 for t in trajs), [t.id for t in trajs]
    assert met["failures/sandbox_engine"] - before.get("failures/sandbox_engine", 0) == N, (before, met)
    assert met["infra_retried"] == sum(met.get(f"failures/{c}", 0) for c in INFRA) and met["finished"] == N, met
    assert len(made) == N + met["infra_retried"]  # every retry in a fresh sandbox (after the stop, on the new daemon)
    assert run_containers(dockerd) == []
    assert host_leftovers(made) == []


async def test_daemon_gone_for_good_every_episode_ends_failed_with_its_cause(dockerd):
    spec = SandboxSpec(backend="docker", image=BUSYBOX, memory_mb=32, pids=32, ttl_s=600)
    made: dict = {}

    async def factory(s):
        sb = await create_sandbox(s).start()
        made[sb.id] = sb
        return sb

    n = N // 2
    # engine_wait_s: each create waits this long for the engine before its retries (120 s by default)
    pool = SandboxPool(factory=factory, max_alive=n, create_rate=50, create_burst=n, retries=1, backoff_s=0.05,
                       engine_wait_s=1.0)
    policy = FleetPolicy(made, steps=1, hold_count=n)
    specs = [EpisodeSpec(SHELL, {"pool": pool, "spec": spec}, seed=i, task={"fault": "hold", "expect": "done"})
             for i in range(n)]
    cfg = ManagerConfig(max_concurrency=n, infra_retries=2, max_failures_per_group=1, step_timeout_s=120,
                        reset_timeout_s=120)
    try:
        async with EnvManager(cfg, policy) as m:
            run = asyncio.ensure_future(m.run_episodes(specs))
            await all_holding(policy, m, run, dockerd)
            await asyncio.to_thread(dockerd.stop)
            trajs = await asyncio.wait_for(run, 300)  # bounded retries, then the driver returns
            met = m.metrics()
    finally:
        await pool.close()
    assert all(t.termination == "error" and t.info["failure_cause"] == "sandbox_engine" for t in trajs), \
        [(t.termination, t.info.get("failure_cause"), t.error) for t in trajs][:3]
    # per task: the first try, 2 infrastructure retries, then 1 charged replacement, then given up
    assert met["failures/sandbox_engine"] == 4 * n and met["infra_retried"] == 2 * n, met
    assert met["failed_groups"] == n and met["running"] == 0
    assert len(made) == n  # no sandbox could be made while the daemon was gone
    await asyncio.to_thread(dockerd.start)  # what the dead daemon left, it removes when it comes back
    await until(lambda: run_containers(dockerd) == [], "the restarted daemon removed the dead containers", 60)
    assert host_leftovers(made) == []
