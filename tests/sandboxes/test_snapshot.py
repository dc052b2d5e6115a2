"""Snapshot reset: a prepared work dir captured once and restored per episode; after a restore the work dir is the
snapshot exactly and nothing of the previous episode (files, /tmp, processes) remains. Both real backends."""

from __future__ import annotations

import pytest

from agentrl.sandboxes import SandboxPool, create_sandbox, restore_snapshot, take_snapshot

from .conftest import until_gone

# Every entry of the work dir with its type, mode, size and content digest (busybox and Debian both have these).
LISTING = ("cd /workspace && find . | sort | while read -r p; do "
           "if [ -L \"$p\" ]; then echo \"$p L $(readlink \"$p\")\"; "
           "elif [ -d \"$p\" ]; then echo \"$p D $(stat -c %a \"$p\")\"; "
           "else echo \"$p F $(stat -c %a \"$p\") $(md5sum < \"$p\" | cut -d' ' -f1)\"; fi; done")

PREPARE = ("mkdir -p src/pkg empty && printf 'def f():\\n    return 1\\n' > src/pkg/mod.py && "
           "printf '\\000\\001\\377binary' > blob.bin && printf '#!/bin/sh\\necho hi\\n' > run.sh && "
           "chmod 755 run.sh && chmod 600 blob.bin && ln -s src/pkg/mod.py link.py")

EPISODE = ("rm -rf src/pkg && echo changed > run.sh && echo new > new.txt && mkdir -p extra/deep && "
           "echo x > extra/deep/y && chmod 777 blob.bin && rm link.py && echo t > /tmp/episode-tmp && "
           "(sleep 1000 &) ")


async def test_restore_brings_back_the_snapshot_exactly(busybox_spec):
    async with create_sandbox(busybox_spec) as prep:
        assert (await prep.exec(PREPARE, timeout=30)).ok
        snap = await take_snapshot(prep)
        want = (await prep.exec(LISTING, timeout=30)).output
    assert "./link.py L src/pkg/mod.py" in want and "./blob.bin F 600" in want and "./run.sh F 755" in want
    async with create_sandbox(busybox_spec) as sb:  # another sandbox of the spec: the snapshot travels
        await restore_snapshot(sb, snap)
        assert (await sb.exec(LISTING, timeout=30)).output == want
        for _ in range(2):  # episode, restore, twice: the state never accumulates
            res = await sb.exec(EPISODE, timeout=30)
            assert res.ok, res.output
            assert (await sb.exec(LISTING, timeout=30)).output != want
            await restore_snapshot(sb, snap)
            assert (await sb.exec(LISTING, timeout=30)).output == want
            assert (await sb.exec("ls -A /tmp", timeout=30)).output.strip() == ""
            assert await until_gone(sb, "sleep 1000") == []
        assert (await sb.exec("sh run.sh && cat src/pkg/mod.py", timeout=30)).output \
            .startswith("hi\ndef f()")


async def test_pool_hands_out_and_restores_snapshot_state(busybox_spec):
    async with create_sandbox(busybox_spec) as prep:
        assert (await prep.exec(PREPARE, timeout=30)).ok
        snap = await take_snapshot(prep)
        want = (await prep.exec(LISTING, timeout=30)).output
    async with SandboxPool(max_alive=2, max_warm=2) as pool:
        await pool.keep_warm(busybox_spec, 2, wait=True, snapshot=snap)
        async with pool.acquire(busybox_spec, reuse=True, snapshot=snap) as sb:
            first = sb.id
            assert pool.stats.warm_hits == 1
            assert (await sb.exec(LISTING, timeout=30)).output == want
            assert (await sb.exec(EPISODE, timeout=30)).ok
        async with pool.acquire(busybox_spec, reuse=True, snapshot=snap) as sb:
            assert sb.id == first and pool.stats.reused == 1  # restored on release, handed out again
            assert (await sb.exec(LISTING, timeout=30)).output == want
            assert (await sb.exec("ls -A /tmp", timeout=30)).output.strip() == ""
        async with pool.acquire(busybox_spec) as sb:  # no snapshot asked: never one holding snapshot state
            assert (await sb.exec("ls -A /workspace", timeout=30)).output.strip() == ""


async def test_snapshot_over_max_bytes_is_refused(busybox_spec):
    from agentrl.sandboxes import FileTooLarge

    async with create_sandbox(busybox_spec) as sb:
        await sb.exec("head -c 200000 /dev/zero > big", timeout=30)
        with pytest.raises(FileTooLarge, match="snapshot"):
            await take_snapshot(sb, max_bytes=100_000)
