"""The shipped cheat suite (agentrl.envs.swe.cheats) against the shipped SWE envs: the in-house suite (its
repository given as a clone whose later commit holds the gold fix) and a real upstream pytest instance (whose clone
holds the newer release). Every cheat must earn reward 0, and the history/test-file ones be flagged. bwrap (the
cheaper backend: the grader's code is the same on both, and the grading tests cover docker)."""

from __future__ import annotations

import pytest

from agentrl.envs.swe.cheats import CHEATS, run_cheats
from agentrl.envs.swe.env import SWEEnv
from agentrl.envs.swe.envspec import EnvSpecs
from agentrl.envs.swe.images import ImageBuilder
from agentrl.envs.swe.instances import load_instances
from agentrl.envs.swe.repos import SUITE_INSTANCES, SUITE_REPOS, RepoStore, build_git_repo, git
from agentrl.sandboxes import SandboxSpec

STATS = "agentrl-suite__statsmini-1"
JINJA = "pallets__jinja-xmlattr-keys"


def _report(results) -> str:
    return "\n".join(f"{r.cheat} {r.instance_id}: reward {r.reward} flagged {r.flagged} naive {r.fools_naive_run} "
                     f"{(r.info.get('grade') or {}).get('reason', '')[:200]}" for r in results)


@pytest.mark.bwrap
async def test_cheats_earn_nothing_on_the_suite(tmp_path, bwrap_ready):
    (inst,) = load_instances(SUITE_INSTANCES, [STATS])
    clone = tmp_path / "repos" / "agentrl-suite__statsmini"
    assert build_git_repo(SUITE_REPOS / "statsmini", clone) == inst.base_commit
    (tmp_path / "gold.patch").write_text(inst.patch)
    git("apply", str(tmp_path / "gold.patch"), cwd=clone)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "the fix", cwd=clone)  # the future
    spec = SandboxSpec(backend="bwrap")
    images = ImageBuilder(spec, RepoStore(tmp_path / "repos", tmp_path / "cache"))
    results = await run_cheats(lambda: SWEEnv([inst], images=images, sandbox=spec), [inst])
    assert len(results) == len(CHEATS) and all(r.ok for r in results), _report(results)
    assert any(r.fools_naive_run for r in results), _report(results)  # the cheats are real: some fool a plain run


@pytest.mark.bwrap
async def test_cheats_earn_nothing_on_a_real_pytest_instance(upstream, bwrap_ready):
    insts = load_instances(upstream / "instances.jsonl", [JINJA])
    spec = SandboxSpec(backend="bwrap")
    images = ImageBuilder(spec, RepoStore(upstream / "repos"), EnvSpecs.load(upstream / "env_specs.yaml"))
    # the naive-run diagnostic is shown on the suite above; here it would cost a pytest session per cheat
    results = await run_cheats(lambda: SWEEnv(insts, images=images, sandbox=spec), insts, naive=False)
    assert len(results) == len(CHEATS) and all(r.ok for r in results), _report(results)
