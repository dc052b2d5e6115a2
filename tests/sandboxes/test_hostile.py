"""Hostile tests: each one plants an escape as the sandbox user would, and asserts that it is contained.

Docker: a command's tree (``setsid env -i`` children included) dies when it returns or times out, even after the
command killed everything it could see; the TTL timer cannot be stopped from inside; images with ``USER root`` run
as an unprivileged uid by default; warm reuse forgets /dev/shm, POSIX and SysV IPC. bwrap: disk limits on the work
dir and /tmp; a seccomp filter and no nested user namespaces; secrets are not on any command line, and neither the
host's PATH nor the driver's cwd shows in the sandbox. Both: file reads and downloads are bounded or streamed; the
state of a SIGKILLed driver is swept when a pool starts.
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agentrl.sandboxes import FileTooLarge, SandboxError, SandboxPool, SandboxSpec, create_sandbox, sweep
from agentrl.sandboxes.base import state_root

from .conftest import BASE, BUSYBOX, LIST_PROCS, leftovers, require_backend, unavailable, until_gone, until_running

DRIVER = Path(__file__).with_name("sandbox_driver.py")


# (1) a command's tree dies with it ---------------------------------------------------------------------------------
async def test_setsid_env_i_children_die_when_the_command_returns(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        t0 = time.monotonic()
        res = await sb.exec(
            "setsid env -i sleep 1021 </dev/null >/dev/null 2>&1 & "
            "(setsid env -i sh -c 'sleep 1022' </dev/null >/dev/null 2>&1 &); echo started", timeout=30)
        assert res.ok and res.output == "started\n" and time.monotonic() - t0 < 10
        left = await until_gone(sb, "sleep 102")  # (a tree takes a moment to die on a loaded machine)
        assert not left, left


async def test_killing_the_reaper_does_not_disable_the_timeout(busybox_spec):
    """The command kills every process it can signal (any in-sandbox watchdog included), then leaves a
    ``setsid env -i`` child and a foreground sleep: the command ends by its timeout at the latest, and nothing
    survives it."""
    kill_all_but_me = (
        'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = "$$" ] || kill -KILL "$p" 2>/dev/null; done; '
        'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = "$$" ] || kill -STOP "$p" 2>/dev/null; done; '
    )
    cmd = kill_all_but_me + "setsid env -i sleep 1031 </dev/null >/dev/null 2>&1 & echo planted; exec sleep 1032"
    async with create_sandbox(busybox_spec) as sb:
        t0 = time.monotonic()
        res = await sb.exec(cmd, timeout=2)
        elapsed = time.monotonic() - t0
        # ended by the timeout, or as killed once its wrapper died (bwrap: the PID namespace goes with it; docker:
        # the engine may close the stream of an exec whose main process is gone)
        assert (res.timed_out and res.exit_code == 124) or res.exit_code == 137, res
        assert "planted" in res.output or not res.timed_out  # bwrap: the wrapper's death may end all at once
        assert elapsed < 2 + 6, elapsed  # the timeout, not a grace period of the driver
        left = await until_gone(sb, "sleep 103")  # (a tree takes a moment to die on a loaded machine)
        assert not left, left
        assert (await sb.exec("echo usable", timeout=20)).output == "usable\n"


# (2) the TTL cannot be stopped from inside ------------------------------------------------------------------------
@pytest.mark.parametrize("user", [None, "0:0"])
async def test_docker_ttl_timer_cannot_be_stopped_from_inside(user):
    require_backend("docker", BUSYBOX)
    from agentrl.sandboxes.docker import docker_client

    spec = SandboxSpec(backend="docker", image=BUSYBOX, ttl_s=5, user=user)
    sb = await create_sandbox(spec).start()
    try:
        # every process but this shell and its wrapper: the container's init and TTL process
        res = await sb.exec(
            'for d in /proc/[0-9]*; do p=${d#/proc/}; case "$p" in $$|$PPID) continue;; esac; '
            'kill -STOP "$p" 2>/dev/null && echo "stopped $p"; kill -KILL "$p" 2>/dev/null && echo "killed $p"; '
            'done; echo tried', timeout=20)
        assert res.ok and res.output == "tried\n", res.output  # neither could be signalled
        t_created = sb.started_at
        gone = False
        while time.time() < t_created + 5 + 15:
            if not docker_client().api.containers(all=True, filters={"id": sb.container_id}):
                gone = True
                break
            await asyncio.sleep(0.5)
        assert gone, f"container still there {time.time() - t_created:.1f}s after start (TTL 5 s): {res.output}"
    finally:
        await sb.stop()


# (3) default user, warm reuse -------------------------------------------------------------------------------------
ROOT_IMAGE = "agentrl-test-rootuser:latest"


@pytest.fixture(scope="module")
def root_user_image():
    """An image whose USER is root, like SWE-bench's (built offline FROM the local base image)."""
    require_backend("docker", BASE)
    from agentrl.sandboxes.docker import docker_client

    client = docker_client()
    client.images.build(fileobj=io.BytesIO(f"FROM {BASE}\nUSER root\n".encode()), tag=ROOT_IMAGE, rm=True)
    assert client.api.inspect_image(ROOT_IMAGE)["Config"]["User"] in ("root", "0", "")
    return ROOT_IMAGE


async def test_docker_root_image_runs_unprivileged_by_default(root_user_image, tmp_path):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "m.py").write_text("x = 1\n")
    spec = SandboxSpec(backend="docker", image=root_user_image, ttl_s=120)
    async with create_sandbox(spec) as sb:
        assert (await sb.exec("id -u; id -g", timeout=20)).output.split() == ["1000", "1000"]
        # what the SWE env does: upload a repository into the work dir, commit, edit, diff, as that user
        await sb.upload(repo, spec.workdir)
        res = await sb.exec("git init -q && git -c user.email=a@b -c user.name=a add -A && "
                            "git -c user.email=a@b -c user.name=a commit -qm init && echo ok", timeout=60)
        assert res.ok, res.output
        await sb.write_file("pkg/m.py", "x = 2\n")
        assert "+x = 2" in (await sb.exec("git diff", timeout=30)).output
        assert (await sb.exec("touch /etc/x", timeout=20)).exit_code != 0
    async with create_sandbox(replace(spec, user="0:0")) as sb:  # asked for explicitly
        assert (await sb.exec("id -u", timeout=20)).output.strip() == "0"


async def test_warm_reuse_forgets_shm_ipc_and_processes(base_spec):
    async with SandboxPool(max_alive=2, max_warm=1) as pool:
        async with pool.acquire(base_spec, reuse=True) as sb:
            first = sb.id
            res = await sb.exec(
                "echo secret > /dev/shm/leak && { [ ! -d /dev/mqueue ] || touch /dev/mqueue/leakq; } && "
                "ipcmk -M 4096 >/dev/null && "
                "ipcmk -Q >/dev/null && ipcmk -S 1 >/dev/null && echo x > /tmp/t && echo y > /workspace/w && "
                "echo planted", timeout=30)
            assert res.output.strip().endswith("planted"), res.output
        async with pool.acquire(base_spec, reuse=True) as sb:
            assert sb.id == first
            res = await sb.exec("ls -A /dev/shm /dev/mqueue /tmp /workspace 2>/dev/null; cat /proc/sysvipc/shm /proc/sysvipc/msg "
                                "/proc/sysvipc/sem | grep -c ' 1000 ' ; true", timeout=30)
            assert "leak" not in res.output and "leakq" not in res.output, res.output
            assert res.output.split()[-1] == "0", res.output  # no SysV object of the previous episode


# (4) bwrap disk limits ---------------------------------------------------------------------------------------------
async def test_bwrap_workdir_and_tmp_have_disk_limits():
    require_backend("bwrap", BUSYBOX)
    if os.geteuid() != 0:
        unavailable("sized tmpfs mounts need root")
    spec = SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=120, workdir_size_mb=8, tmp_size_mb=4, memory_mb=128)
    async with create_sandbox(spec) as sb:
        for path, mb in (("/workspace/big", 8), ("/tmp/big", 4)):
            res = await sb.exec(f"dd if=/dev/zero of={path} bs=1M count=64 2>&1; ls -l {path}", timeout=60)
            assert "No space left" in res.output, res.output
            size = int(res.output.split()[-5])
            assert size <= mb << 20, res.output
        df = (await sb.exec("df -k /workspace /tmp | tail -n 2", timeout=20)).output.split()
        assert df[1] == str(8 << 10) and df[7] == str(4 << 10), df
        assert (await sb.exec("rm /workspace/big && echo ok > /workspace/f && cat /workspace/f", timeout=20)).output == "ok\n"


async def test_bwrap_disk_caps_stay_out_of_the_hosts_mount_table():
    """Every bwrap exec copies the mount table it starts from (~14 µs of CPU per mount, bench_exec_mounts.py), so
    a sandbox's capped work dir and /tmp are mounted in a namespace of its own: the host's table does not grow with
    the fleet, each sandbox still sees its own tmpfs of its own size, and a full one is still reported."""
    require_backend("bwrap", BUSYBOX)
    if os.geteuid() != 0:
        unavailable("sized tmpfs mounts need root")
    spec = SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=120, workdir_size_mb=2, tmp_size_mb=1, memory_mb=64)
    async with create_sandbox(spec) as a, create_sandbox(replace(spec, workdir_size_mb=3)) as b:
        assert a.limits.endswith("+tmpfs") and b.limits.endswith("+tmpfs"), (a.limits, b.limits)
        assert not _mounts_under(state_root()), _mounts_under(state_root())
        assert (await a.exec("echo mine > /workspace/f && echo t > /tmp/t", timeout=20)).ok
        seen = await b.exec("ls -A /workspace /tmp; df -k /workspace | tail -n 1", timeout=20)
        assert "f" not in seen.output.split() and "t" not in seen.output.split(), seen.output
        assert seen.output.split()[-5] == str(3 << 10), seen.output
        full = await a.exec("dd if=/dev/zero of=/workspace/big bs=1M count=8", timeout=60)
        assert full.exit_code != 0 and full.disk_full, full
        assert not (await b.exec("true", timeout=20)).disk_full
        assert not any((a.state_dir / "work").iterdir())  # the host's dir under the mount stays empty
    assert not a.state_dir.exists() and not _mounts_under(state_root())


async def test_bwrap_commands_run_as_the_sandboxs_own_host_uid_with_no_groups():
    """Seen from the host, every process of a root driver's sandbox runs as that sandbox's own unprivileged uid
    and gid with no supplementary group (the exec enters its mount namespace and drops root in one step)."""
    require_backend("bwrap", BUSYBOX)
    if os.geteuid() != 0:
        unavailable("a distinct host uid per sandbox needs a root driver")
    async with create_sandbox(SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=60)) as sb:
        assert sb.cgroup is not None and sb.host_uid is not None
        task = asyncio.create_task(sb.exec("until [ -e go ]; do sleep 0.05; done", timeout=120))
        await until_running(sb, "until [ -e go ]")
        statuses = []
        for pid in sb.cgroup.pids():
            try:
                statuses.append(Path(f"/proc/{pid}/status").read_text())
            except OSError:
                pass  # a short-lived child gone meanwhile
        assert (await sb.exec("touch go", timeout=20)).ok
        assert (await task).ok
        assert statuses
        for st in statuses:
            fields = dict(line.split(":", 1) for line in st.splitlines() if ":" in line)
            assert fields["Uid"].split() == [str(sb.host_uid)] * 4, st
            assert fields["Gid"].split() == [str(sb.host_uid)] * 4, st
            assert fields["Groups"].strip() == "", st


async def test_no_namespace_or_driver_descriptor_reaches_a_bwrap_command():
    """A command sees its stdio (and PID 1, the wrapper, its own pipes) and nothing of the driver's: neither the
    descriptor an exec enters the sandbox's mount namespace by, nor bwrap's options and seccomp memfds."""
    require_backend("bwrap", BUSYBOX)
    async with create_sandbox(SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=60)) as sb:
        for _ in range(2):
            out = (await sb.exec("ls -l /proc/1/fd/ /proc/self/fd/ 2>/dev/null; true", timeout=20)).output
            assert "->" in out and "mnt:" not in out and "memfd" not in out and "socket:" not in out, out


def test_private_tmpfs_is_released_with_its_descriptors_and_a_failed_mount_names_its_cause(tmp_path):
    from agentrl.sandboxes.bwrap_state import private_tmpfs

    if os.geteuid() != 0:
        unavailable("tmpfs mounts need root")
    open_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="mount helper failed.*(No such file|does not exist|mount point)"):
        private_tmpfs([(tmp_path / "missing", 1, 0o755)], 300_001)
    assert len(os.listdir("/proc/self/fd")) == open_before  # nothing held after a failure
    (tmp_path / "w").mkdir()
    m = private_tmpfs([(tmp_path / "w", 2, 0o700)], 300_001)
    assert len(os.listdir("/proc/self/fd")) == open_before + 2
    assert m.free_blocks()[0][0] * os.fstatvfs(m.dirs[0]).f_frsize == 2 << 20
    assert os.fstat(m.dirs[0]).st_uid == 300_001 and not _mounts_under(tmp_path)
    os.close(m.dup_ns())
    m.close()
    m.close()  # twice is fine
    assert len(os.listdir("/proc/self/fd")) == open_before and m.free_blocks() == []
    with pytest.raises(OSError, match="released"):
        m.dup_ns()


# (5) bwrap seccomp, userns, secrets, environ ----------------------------------------------------------------------
async def test_bwrap_has_seccomp_and_no_nested_user_namespaces():
    require_backend("bwrap", BUSYBOX)
    spec = SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=60)
    async with create_sandbox(spec) as sb:
        status = (await sb.exec("grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status", timeout=20)).output
        assert "Seccomp:\t2" in status and "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status
        for attempt in ("unshare -U -r id", "unshare -U id", "unshare -m id", "unshare -n id", "unshare -p -f id"):
            res = await sb.exec(attempt, timeout=20)
            assert res.exit_code != 0 and "uid=" not in res.output, (attempt, res.output)
        assert (await sb.exec("mkdir -p /tmp/m && mount -t tmpfs x /tmp/m", timeout=20)).exit_code != 0
        assert (await sb.exec("echo fine", timeout=20)).output == "fine\n"  # ordinary work still runs


async def test_bwrap_secrets_stay_off_command_lines_and_host_env_stays_out():
    require_backend("bwrap", BUSYBOX)
    token = f"s3cret-{secrets.token_hex(8)}"
    spec = SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=60, env={"API_TOKEN": token})
    async with create_sandbox(spec) as sb:
        # held until the test has looked at every command line (the file "go" in the work dir releases it)
        task = asyncio.create_task(sb.exec("until [ -e go ]; do sleep 0.05; done; echo $API_TOKEN $EXEC_TOKEN",
                                           timeout=120, env={"EXEC_TOKEN": token + "-exec"}))
        await until_running(sb, "until [ -e go ]")
        seen = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if token.encode() in (d / "cmdline").read_bytes():
                        seen.append(d.name)
                except OSError:
                    pass
        assert (await sb.exec("touch go", timeout=20)).ok
        res = await task
        assert res.output.split() == [token, token + "-exec"]  # the env still arrives
        assert not seen, f"the secret is on the command line of host processes {seen}"
        inside = (await sb.exec("tr '\\0' '\\n' </proc/1/environ; echo ---; tr '\\0' ' ' </proc/1/cmdline", timeout=20))
        host_path = os.environ.get("PATH", "")
        # PID 1 is the exec's own wrapper (bwrap --as-pid-1): its environment is exactly the sandbox's, which the
        # command sees anyway; nothing of the host's or of another exec's (EXEC_TOKEN went to the first exec only).
        env_keys = {line.split("=", 1)[0] for line in inside.output.split("---")[0].split()}
        assert env_keys == {"PATH", "HOME", "LANG", "API_TOKEN", "PWD"}, inside.output
        assert token + "-exec" not in inside.output
        assert host_path not in inside.output and "AGENTRL" not in inside.output, inside.output
        assert f"PWD={os.getcwd()}" not in inside.output and os.getcwd() not in inside.output.split("---")[0]


# (6) state of a SIGKILLed driver expires by itself ---------------------------------------------------------------
def _mounts_under(path: Path) -> list[str]:
    return [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
            if ln.split()[4].startswith(str(path))]


async def test_pool_start_sweeps_a_killed_drivers_state_and_expired_sandboxes():
    require_backend("docker", BUSYBOX)
    require_backend("bwrap", BUSYBOX)
    dead_run, live_run = f"test-dead-{secrets.token_hex(3)}", f"test-expired-{secrets.token_hex(3)}"
    procs = []
    try:
        for run, ttl in ((dead_run, 600), (live_run, 2)):
            p = subprocess.Popen([sys.executable, str(DRIVER), run, str(ttl), "docker,bwrap", "wait"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            procs.append(p)
            line = p.stdout.readline()
            assert line.startswith("READY "), (line, p.stderr.read()[-2000:] if p.poll() is not None else "")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        await asyncio.sleep(2.5)  # the live driver's sandboxes are past their 2 s TTL now
        assert (state_root() / dead_run).is_dir() and (state_root() / live_run).is_dir()
        cgroups = [d for d in Path("/sys/fs/cgroup").glob(f"*/agentrl/{dead_run}")]
        async with SandboxPool() as pool:
            async with pool.acquire(SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=60)) as sb:
                assert (await sb.exec("true", timeout=20)).ok
            async with pool.acquire(SandboxSpec(backend="docker", image=BUSYBOX, ttl_s=60)) as sb:
                assert (await sb.exec("true", timeout=20)).ok
            report = await pool.swept()
        assert sum(r.startswith(dead_run) for r in report.bwrap) == 2, report
        assert sum(r.startswith(live_run) for r in report.bwrap) == 2, report
        assert sum(r.startswith(dead_run) for r in report.containers) == 2, report
        for run in (dead_run, live_run):
            assert not (state_root() / run).exists()
            assert not _mounts_under(state_root() / run)
        assert not any(d.exists() for d in cgroups)
    finally:
        for p in procs:
            p.kill()
        sweep(dead_run)
        sweep(live_run)


# (7) bounded reads, streamed downloads -----------------------------------------------------------------------------
class _PeakRSS:
    """Samples this process's resident memory every few milliseconds; ``peak`` is the largest seen."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * page
            self.peak = max(self.peak, rss)
            time.sleep(0.005)

    def __enter__(self):
        self._t.start()
        time.sleep(0.02)
        self.base = self.peak
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


async def test_read_file_and_download_are_bounded_and_stream(busybox_spec, tmp_path):
    size = 96 << 20
    async with create_sandbox(busybox_spec) as sb:
        await sb.exec(f"truncate -s {size} big && mkdir d && truncate -s {size} d/big && echo hi > small", timeout=30)
        with pytest.raises(FileTooLarge) as err:
            await sb.read_file("big", max_bytes=1 << 20)
        msg = str(err.value)
        assert "/workspace/big" in msg and str(size) in msg and "max_bytes" in msg, msg
        assert err.value.path == "/workspace/big" and err.value.size == size
        with pytest.raises(FileTooLarge):
            await sb.read_file("big")  # the default bound (64 MiB) is below 96 MiB
        with pytest.raises(FileTooLarge):
            await sb.read_file("/dev/zero", max_bytes=4096)  # no size to stat, no end
        assert await sb.read_file("small", max_bytes=3) == b"hi\n"
        with pytest.raises(FileTooLarge):
            await sb.read_file("small", max_bytes=2)
        with pytest.raises(SandboxError, match="missing"):
            await sb.read_file("missing", max_bytes=10)
        with _PeakRSS() as rss:
            n = await sb.download_file("big", tmp_path / "big")
            await sb.download("d", tmp_path / "d")
        assert n == size and (tmp_path / "big").stat().st_size == size
        assert (tmp_path / "d" / "big").stat().st_size == size
        assert rss.peak - rss.base < 40 << 20, f"downloads buffered: peak RSS +{(rss.peak - rss.base) >> 20} MiB"
        with pytest.raises(FileTooLarge) as err:
            await sb.download("d", tmp_path / "d2", max_bytes=1 << 20)
        assert "/workspace/d" in str(err.value)
        with pytest.raises(FileTooLarge):
            await sb.download_file("big", tmp_path / "big2", max_bytes=1 << 20)
        assert not (tmp_path / "big2").exists()  # no partial file left behind


async def test_docker_reaper_is_host_side_here_and_the_fallback_still_works(monkeypatch, tmp_path):
    """As root next to the engine the driver kills exec groups itself; without that (remote engine, non-root) the
    in-container watchdog still gives timeouts, leftovers-killing, files and reset (weaker: a command can kill it)."""
    require_backend("docker", BUSYBOX)
    spec = SandboxSpec(backend="docker", image=BUSYBOX, ttl_s=120)
    if os.geteuid() == 0:
        async with create_sandbox(spec) as sb:
            assert sb.reaper == "host-cgroup"
    monkeypatch.setenv("AGENTRL_DOCKER_REAPER", "in-sandbox")
    async with create_sandbox(spec) as sb:
        assert sb.reaper == "in-sandbox"
        assert (await sb.exec("id -u; echo $0", timeout=20)).output.split()[0] == "1000"
        res = await sb.exec("sleep 1041 & echo bg; sleep 1042", timeout=1.5)
        assert res.timed_out and res.output == "bg\n"
        assert not await leftovers(sb, "sleep 104")
        await sb.write_file("d/f.txt", "hello")
        assert await sb.read_file("d/f.txt", max_bytes=5) == b"hello"
        with pytest.raises(FileTooLarge):
            await sb.read_file("d/f.txt", max_bytes=4)
        await sb.download("d", tmp_path / "d")
        assert (tmp_path / "d" / "f.txt").read_text() == "hello"
        await sb.exec("echo x > /dev/shm/s", timeout=20)
        await sb.reset()
        assert (await sb.exec("ls -A /workspace /dev/shm", timeout=20)).output.split() == ["/dev/shm:", "/workspace:"]


async def test_docker_exec_groups_in_the_v1_freezer(monkeypatch):
    """Hosts without a cgroup2 hierarchy use the v1 freezer (freeze, kill, thaw) for exec groups: the same escapes
    are contained."""
    require_backend("docker", BUSYBOX)
    if os.geteuid() != 0:
        unavailable("exec groups need root")
    from agentrl.sandboxes import cgroups

    real = cgroups._mounts
    monkeypatch.setattr(cgroups, "_mounts", lambda: [m for m in real() if m[2] != "cgroup2"])
    spec = SandboxSpec(backend="docker", image=BUSYBOX, ttl_s=120)
    async with create_sandbox(spec) as sb:
        if sb.groups is None:
            pytest.skip("no v1 freezer hierarchy on this host")
        assert sb.groups.mode == "v1-freezer"
        res = await sb.exec("setsid env -i sleep 1051 </dev/null >/dev/null 2>&1 & echo started", timeout=20)
        assert res.ok and res.output == "started\n"
        t0 = time.monotonic()
        # a tree that keeps forking until the pid limit while it is frozen and killed
        res = await sb.exec("setsid env -i sleep 1052 </dev/null >/dev/null 2>&1 & "
                            "(while :; do sleep 1053 & done) 2>/dev/null & exec sleep 1054", timeout=2)
        assert res.timed_out and time.monotonic() - t0 < 8, res
        left = await until_gone(sb, "sleep 105")
        assert not left, left
        assert not sb.groups.groups()  # every exec group was removed


# (9) an exec's input no sandbox can run: the same clear error from every backend ----------------------------------
async def test_commands_no_sandbox_can_run_are_bad_commands_and_the_sandbox_stays_usable(busybox_spec):
    """bwrap raised ValueError or UnicodeEncodeError on some of these and could not start on a long command (a
    SandboxError, as if the sandbox had failed); docker ran them and answered exit 1 with no output, or exit 126.
    Now both raise BadCommand naming the input before anything runs, and a command at the limit runs."""
    from agentrl.sandboxes import MAX_COMMAND_BYTES, BadCommand

    bad = [(dict(cmd="echo a\x00b"), "NUL"), (dict(cmd=["echo", "a\x00b"]), "NUL"),
           (dict(cmd="echo \ud800"), "surrogate"), (dict(cmd="echo " + "x" * MAX_COMMAND_BYTES), "at most"),
           (dict(cmd="echo $A", env={"A": "x\x00y"}), "env A"), (dict(cmd="echo $A", env={"A": "\ud800"}), "env A"),
           (dict(cmd="true", env={"A=B": "x"}), "env name"), (dict(cmd="true", env={"": "x"}), "env name"),
           (dict(cmd="pwd", cwd="a\x00b"), "cwd"), (dict(cmd="true", output_limit=-1), "output_limit")]
    async with create_sandbox(busybox_spec) as sb:
        for kw, words in bad:
            cmd = kw.pop("cmd")
            with pytest.raises(BadCommand, match=words):
                await sb.exec(cmd, **kw)
        # at the limit: one 131,071-byte argument runs (printf is a busybox builtin: no second exec of it)
        pad = MAX_COMMAND_BYTES - len("printf %s ") - len(" | wc -c")
        r = await sb.exec("printf %s " + "y" * pad + " | wc -c", timeout=60)
        assert r.exit_code == 0 and r.output.strip() == str(pad), r.output[:200]
        assert (await sb.exec("echo still usable")).output.strip() == "still usable"
        # the file operations' paths too (bwrap raised ValueError / UnicodeEncodeError, docker a SandboxError as if
        # the sandbox had failed, or read a file under another name)
        for path in ("a\x00b", "\ud800"):
            for op in (sb.read_file(path), sb.write_file(path, b"x"), sb.download_file(path, "/dev/null")):
                with pytest.raises(BadCommand, match="the path"):
                    await op
        with pytest.raises(TypeError, match="data must be bytes or str, got int"):
            await sb.write_file("n.txt", 12345)
        assert (await sb.exec("echo still usable")).output.strip() == "still usable"
