"""exec, timeouts, output cap, files: against the real docker engine and real bwrap."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.sandboxes import ExecResult, OutputCap, SandboxError, SandboxSpec, create_sandbox

from .conftest import LIST_PROCS


async def test_exec_basics(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        res = await sb.exec("echo out; echo err >&2; pwd; id -u; echo $FOO; exit 3", timeout=10, env={"FOO": "bar"})
        assert isinstance(res, ExecResult)
        assert res.exit_code == 3 and not res.timed_out and not res.truncated and not res.ok
        assert res.output.split("\n")[:5] == ["out", "err", "/workspace", "1000", "bar"]
        assert res.duration > 0
        res = await sb.exec(["sh", "-c", 'printf "%s|" "$0"', "a b; echo no"], timeout=10)  # argv: no re-splitting
        assert res.output == "a b; echo no|" and res.ok
        await sb.exec("mkdir -p sub/dir", timeout=10)
        assert (await sb.exec("pwd", timeout=10, cwd="sub/dir")).output.strip() == "/workspace/sub/dir"


async def test_timeout_kills_whole_tree_and_sandbox_stays_usable(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        t0 = time.monotonic()
        # A child in the background, a grandchild in its own session (escapes a process-group kill), a foreground.
        res = await sb.exec(
            "echo started; sleep 1001 & (setsid sleep 1002 &); sh -c 'sleep 1003; echo never'", timeout=1.5
        )
        elapsed = time.monotonic() - t0
        assert res.timed_out and res.exit_code == 124
        assert "started" in res.output and "never" not in res.output
        assert 1.4 < elapsed < 6, elapsed
        procs = (await sb.exec(LIST_PROCS, timeout=10)).output
        assert "sleep 100" not in procs, procs
        again = await sb.exec("echo still alive", timeout=10)
        assert again.ok and again.output == "still alive\n"


async def test_background_leftovers_are_killed_when_command_returns(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        t0 = time.monotonic()
        res = await sb.exec("sleep 1004 & echo bg", timeout=30)
        assert res.ok and res.output == "bg\n" and time.monotonic() - t0 < 5  # did not wait for the sleep
        procs = (await sb.exec(LIST_PROCS, timeout=10)).output
        assert "sleep 1004" not in procs, procs


async def test_timeout_with_base_image_and_ps(base_spec):
    """The base image has procps: `ps` inside confirms nothing of a timed-out python tree runs on."""
    async with create_sandbox(base_spec) as sb:
        cmd = "python3 -c 'import subprocess,time; subprocess.Popen([\"sleep\",\"1005\"]); time.sleep(1006)'"
        res = await sb.exec(cmd, timeout=1)
        assert res.timed_out
        ps = await sb.exec("ps -eo args", timeout=10)
        assert ps.ok and "sleep 100" not in ps.output and "time.sleep" not in ps.output, ps.output


async def test_output_cap_keeps_head_and_tail(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        res = await sb.exec(
            "echo HEAD-MARK; head -c 200000 /dev/zero | tr '\\0' x; echo; echo TAIL-MARK", timeout=20, output_limit=2000
        )
        assert res.ok and res.truncated
        assert res.output.startswith("HEAD-MARK\nxxx") and res.output.endswith("xxx\nTAIL-MARK\n")
        assert "bytes of output truncated" in res.output
        assert len(res.output) < 2100
        small = await sb.exec("echo short", timeout=10, output_limit=2000)
        assert not small.truncated and small.output == "short\n"
        # A flood far beyond the cap finishes and stays capped (spec default cap: 1 MiB).
        flood = await sb.exec("yes | head -c 20000000", timeout=30)
        assert flood.truncated and len(flood.output) <= (1 << 20) + 100


async def test_binary_output_is_decoded_with_replacement(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        res = await sb.exec("printf 'a\\377\\376b'; head -c 5000 /dev/urandom", timeout=10)
        assert res.ok and isinstance(res.output, str)
        assert res.output.startswith("a\ufffd\ufffdb")


def test_output_cap_unit():
    cap = OutputCap(10)
    for chunk in (b"0123", b"456789abc", b"def"):
        cap.feed(chunk)
    assert cap.truncated and cap.total == 16
    assert bytes(cap.head) == b"01234" and bytes(cap.tail) == b"bcdef"
    assert cap.text().startswith("01234\n[... 6 bytes") and cap.text().endswith("bcdef")


async def test_files_roundtrip(busybox_spec, tmp_path):
    async with create_sandbox(busybox_spec) as sb:
        blob = bytes(range(256)) * 100
        await sb.write_file("deep/dir/blob.bin", blob)
        assert await sb.read_file("/workspace/deep/dir/blob.bin") == blob
        await sb.write_file("/tmp/t.txt", "text ü\n")
        assert (await sb.exec("cat /tmp/t.txt", timeout=10)).output == "text ü\n"
        with pytest.raises(SandboxError, match="missing.txt"):
            await sb.read_file("missing.txt")
        with pytest.raises(SandboxError):
            await sb.write_file("/etc/forbidden", b"x")

        src = tmp_path / "src"
        (src / "pkg").mkdir(parents=True)
        (src / "pkg" / "a.py").write_text("print('a')\n")
        (src / "b.bin").write_bytes(b"\x00\x01")
        await sb.upload(src, "/workspace/repo")
        listing = (await sb.exec("find repo -type f | sort", timeout=10)).output.split()
        assert listing == ["repo/b.bin", "repo/pkg/a.py"]
        await sb.exec("echo new > repo/pkg/c.txt", timeout=10)
        dst = tmp_path / "dst"
        await sb.download("repo", dst)
        assert (dst / "pkg" / "c.txt").read_text() == "new\n"
        assert (dst / "b.bin").read_bytes() == b"\x00\x01"


async def test_git_workflow_on_base_image(base_spec, tmp_path):
    """What the SWE env does: upload a repo, edit, `git diff`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "m.py").write_text("x = 1\n")
    async with create_sandbox(base_spec) as sb:
        await sb.upload(repo)
        setup = await sb.exec(
            "git init -q && git -c user.email=a@b -c user.name=a add -A && "
            "git -c user.email=a@b -c user.name=a commit -qm init && echo ok",
            timeout=30,
        )
        assert setup.ok, setup.output
        await sb.write_file("m.py", "x = 2\n")
        diff = await sb.exec("git diff", timeout=30)
        assert diff.ok and "-x = 1" in diff.output and "+x = 2" in diff.output
        py = await sb.exec("python3 -c 'import sys; print(sys.version_info[0])'", timeout=30)
        assert py.output.strip() == "3"


async def test_many_concurrent_execs_in_one_sandbox(busybox_spec):
    async with create_sandbox(busybox_spec) as sb:
        results = await asyncio.gather(*(sb.exec(f"sleep 0.3; echo {i}", timeout=20) for i in range(8)))
        assert [r.output.strip() for r in results] == [str(i) for i in range(8)]


async def test_host_mounts_read_only_and_read_write(busybox_spec):
    import os
    import shutil
    import tempfile
    from dataclasses import replace

    from agentrl.sandboxes import Mount

    host = tempfile.mkdtemp(prefix="agentrl-mount-test-")
    try:
        os.makedirs(f"{host}/ro")
        os.makedirs(f"{host}/rw")
        with open(f"{host}/ro/data.txt", "w") as f:
            f.write("from host\n")
        os.chmod(host, 0o755)
        os.chmod(f"{host}/ro", 0o755)
        os.chmod(f"{host}/rw", 0o777)
        spec = replace(busybox_spec, mounts=(Mount(f"{host}/ro", "/data"), Mount(f"{host}/rw", "/out", read_only=False)))
        async with create_sandbox(spec) as sb:
            assert (await sb.exec("cat /data/data.txt", timeout=20)).output == "from host\n"
            assert (await sb.exec("echo x > /data/new", timeout=20)).exit_code != 0
            assert (await sb.exec("echo result > /out/r.txt", timeout=20)).ok
        with open(f"{host}/rw/r.txt") as f:
            assert f.read() == "result\n"
    finally:
        shutil.rmtree(host, ignore_errors=True)


async def test_a_bwrap_exec_starts_no_waitpid_thread(default_watcher, started_threads):
    """Thousands of commands a minute each spawn a bwrap: asyncio's default watcher on Python 3.11 would start (and
    wait for) one thread per command (agentrl.childwatch)."""
    import sys

    from .conftest import BUSYBOX, require_backend

    require_backend("bwrap", BUSYBOX)
    if sys.version_info >= (3, 12):
        pytest.skip("Python 3.12+ watches children by pidfd itself")
    spec = SandboxSpec(backend="bwrap", image=BUSYBOX, ttl_s=300, memory_mb=256, pids=128)
    async with create_sandbox(spec) as sb:
        for code in (0, 7):
            res = await sb.exec(f"echo hi; exit {code}", timeout=10)
            assert res.exit_code == code and res.output == "hi\n"
    assert not [n for n in started_threads if "waitpid" in n], started_threads
