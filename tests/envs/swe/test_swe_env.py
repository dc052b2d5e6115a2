"""SWEEnv end to end against real docker: oracle and empty episodes, invalid tool calls, limits, cleanup."""

import pytest

from agentrl.policy import ScriptedPolicy
from agentrl.tools import format_tool_call as call
from agentrl.envs.swe import SWEEnv, empty_policy_fn, load_instances, oracle_policy_fn, run_episode
from agentrl.envs.swe.repos import SUITE_INSTANCES

pytestmark = pytest.mark.docker

INSTANCES = load_instances(SUITE_INSTANCES)
BY_ID = {i.instance_id: i for i in INSTANCES}
STATS = "agentrl-suite__statsmini-1"
INTERVALS = "agentrl-suite__intervals-1"


@pytest.fixture(scope="module", autouse=True)
def docker_ready():
    """Fails (never skips) without a docker engine and the base image."""
    from agentrl.sandboxes.docker import docker_available, docker_client

    ok, why = docker_available()
    assert ok, f"docker is required for the SWE env tests: {why}"
    try:
        docker_client().images.get("agentrl-base:latest")
    except Exception as e:
        pytest.fail(f"image agentrl-base:latest missing (run `agentrl sandboxes build-image`): {e}")


def _containers(label_value):
    from agentrl.sandboxes.base import LABEL_SANDBOX
    from agentrl.sandboxes.docker import docker_client

    return docker_client().containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}={label_value}"})


async def test_oracle_episode_resolves():
    env = SWEEnv(instance_ids=[STATS])
    try:
        res = await run_episode(env, ScriptedPolicy(oracle_policy_fn(INSTANCES)), STATS)
    finally:
        await env.aclose()
    assert res.reward == 1.0 and res.terminated and not res.truncated and res.turns == 3
    info = res.info
    assert info["resolved"] is True and info["exit_reason"] == "submitted"
    assert info["grade"]["reason"] == "resolved" and info["grade"]["fail_to_pass_fraction"] == 1.0
    assert info["integrity"] == {"git_history": [], "protected_touched": [], "flagged": False}
    # the submitted diff is the gold change, taken with git diff against base_commit (no stray files)
    assert info["patch"].startswith("diff --git a/statsmini/describe.py")
    assert "+    return (values[mid - 1] + values[mid]) / 2" in info["patch"] and "gold.patch" not in info["patch"]


async def test_empty_episode_scores_zero():
    env = SWEEnv(instance_ids=[STATS])
    try:
        res = await run_episode(env, ScriptedPolicy(empty_policy_fn), STATS)
    finally:
        await env.aclose()
    assert res.reward == 0.0 and res.terminated and res.turns == 1
    assert res.info["resolved"] is False and res.info["patch"] == ""
    assert res.info["grade"]["reason"].startswith("FAIL_TO_PASS not passing")


async def test_invalid_calls_tools_and_truncation_grades_current_diff():
    fix_old = "    return values[len(values) // 2]"
    fix_new = ("    mid = len(values) // 2\n    if len(values) % 2:\n        return values[mid]\n"
               "    return (values[mid - 1] + values[mid]) / 2")
    actions = [
        ("I think the bug is in median.", "No tool call found"),
        ("<tool_call>{not json}</tool_call>", "invalid JSON"),
        ("<tool_call>" + '{"name": "bash", "arguments": {"command": "true"}}', "missing closing"),
        (call("rm_rf", {}), "unknown tool 'rm_rf'"),
        (call("bash", {}), "missing required argument 'command'"),
        (call("bash", {"command": 5}), "must be string"),
        (call("view", {"path": "nope.py"}), "does not exist"),
        (call("view", {"path": "statsmini/describe.py", "start_line": 50, "end_line": 2}), "invalid range"),
        (call("str_replace", {"path": "statsmini/describe.py", "old_str": "zzz", "new_str": "y"}), "not found"),
        (call("str_replace", {"path": "statsmini/describe.py", "old_str": "values", "new_str": "v"}), "occurs"),
        (call("create", {"path": "README.md", "file_text": "x"}), "already exists"),
        (call("submit", {"now": True}), "unknown argument"),
        # no sandbox can run a NUL byte (BadCommand): the call's error, not an exception out of the step
        (call("bash", {"command": "echo a\x00b"}), "NUL byte"),
        (call("view", {"path": "a\x00b.py"}), "NUL byte"),
    ]
    ok_actions = [
        (call("bash", {"command": "sleep 30", "timeout": 1}), "timed out"),
        (call("bash", {"command": "python3 -c \"print('x' * 50000)\""}), "truncated"),
        (call("view", {"path": "statsmini/describe.py", "start_line": 17, "end_line": 19}), "    18\tdef median(values):"),
        (call("view", {"path": "."}), "statsmini/describe.py"),
        (call("str_replace", {"path": "statsmini/describe.py", "old_str": fix_old, "new_str": fix_new}), "Edited statsmini/describe.py"),
        (call("create", {"path": "notes/todo.txt", "file_text": "done\n"}), "Created notes/todo.txt"),
        (call("bash", {"command": "python3 -m unittest tests.test_describe 2>&1 | tail -1"}), "OK"),
    ]
    env = SWEEnv(instance_ids=[STATS], max_turns=len(actions) + len(ok_actions), max_output_chars=2000)
    try:
        obs, info = await env.areset(options={"instance_id": STATS})
        assert [m["role"] for m in obs] == ["system", "user"] and "<tool_call>" in obs[0]["content"]
        assert "median()" in obs[1]["content"] and info["instance_id"] == STATS
        assert {t["function"]["name"] for t in info["tools"]} == {"bash", "view", "str_replace", "create", "submit"}
        for action, expect in actions:
            msgs, reward, term, trunc, step_info = await env.astep(action)
            text = "\n".join(m["content"] for m in msgs)
            assert expect in text, (action, text)
            assert reward == 0.0 and not term and not trunc and step_info["invalid_calls"] == 1
        for i, (action, expect) in enumerate(ok_actions):
            msgs, reward, term, trunc, step_info = await env.astep(action)
            text = "\n".join(m["content"] for m in msgs)
            assert expect in text, (action, text)
            assert msgs[0]["role"] == "tool" and len(text) < 2600
            if i < len(ok_actions) - 1:
                assert reward == 0.0 and not term and not trunc and step_info["invalid_calls"] == 0
        # the last action hit max_turns: the episode is truncated and the current diff graded
        assert trunc and not term and reward == 1.0
        assert step_info["exit_reason"] == "max_turns" and step_info["resolved"] is True
        assert step_info["invalid_calls_total"] == len(actions)
        assert "b/notes/todo.txt" in step_info["patch"]  # new files are part of the patch
        msgs, reward, term, trunc, _ = await env.astep(call("submit", {}))
        assert term and reward == 0.0 and "episode is over" in msgs[0]["content"]
    finally:
        await env.aclose()


async def test_reads_are_bounded_in_the_sandbox_before_reaching_the_driver():
    """A 512 MiB sparse file (and a 3 MiB real one, and a symlink to the big one) are refused by view and
    str_replace with their size, without the driver reading them."""
    import resource

    env = SWEEnv(instance_ids=[STATS])
    try:
        obs, _ = await env.areset(options={"instance_id": STATS})
        assert "Tests use unittest: `python3 -m unittest -v tests.test_describe`" in obs[0]["content"]
        await env.astep(call("bash", {"command": "truncate -s 512M big.bin && head -c 3000000 /dev/zero | tr '\\0' a > mid.txt"
                                                 " && ln -s big.bin link.bin && ls -la"}))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        texts = []
        for action in (call("view", {"path": "big.bin"}), call("view", {"path": "link.bin"}),
                       call("str_replace", {"path": "big.bin", "old_str": "a", "new_str": "b"}),
                       call("view", {"path": "mid.txt", "start_line": 1, "end_line": 1})):
            msgs, reward, term, trunc, info = await env.astep(action)
            texts.append(msgs[0]["content"])
            assert info["invalid_calls"] == 1 and not term
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        msgs, *_ = await env.astep(call("bash", {"command": "git log --all --oneline; git fsck --lost-found"}))
        msgs, reward, term, trunc, info = await env.astep(call("submit", {}))
    finally:
        await env.aclose()
    assert all("536870912 bytes" in t for t in texts[:3]) and "3000000 bytes" in texts[3], texts
    assert "use bash" not in texts[0] and "with bash" in texts[0]
    assert grown_kib < 64 * 1024, f"the driver grew by {grown_kib} KiB"
    assert info["integrity"]["flagged"] and info["integrity"]["git_history"] == ["git log --all --oneline; git fsck --lost-found"]


async def test_partial_credit_and_multiple_calls_per_turn():
    inst = BY_ID[INTERVALS]
    env = SWEEnv([inst], partial_credit=True)
    try:
        await env.areset()
        action = (call("str_replace", {"path": "intervals/core.py", "old_str": "for start, end in intervals:\n        if start > end",
                                       "new_str": "for start, end in sorted(intervals):\n        if start > end"})
                  + "\nthen\n" + call("submit", {}) + call("bash", {"command": "touch never_run"}))
        msgs, reward, term, trunc, info = await env.astep(action)
    finally:
        await env.aclose()
    assert term and info["exit_reason"] == "submitted" and not info["resolved"]
    assert reward == 0.5 and "never_run" not in info["patch"]
    assert [m.get("name") for m in msgs] == ["str_replace", "submit"]


async def test_aclose_releases_the_sandbox_and_dead_sandbox_ends_episode():
    env = SWEEnv(instance_ids=[STATS])
    await env.areset()
    sb_id = env._sb.id
    assert len(_containers(sb_id)) == 1
    await env.aclose()
    await env.aclose()  # idempotent
    assert _containers(sb_id) == []

    await env.areset()
    sb_id = env._sb.id
    try:
        await env._sb.stop()  # the sandbox dies under the episode
        msgs, reward, term, trunc, info = await env.astep(call("bash", {"command": "ls"}))
    finally:
        await env.aclose()
    assert trunc and reward == 0.0 and info["exit_reason"] == "sandbox_error" and "error" in info
    assert _containers(sb_id) == []


def test_sync_api_check_env_and_registry_entry_point():
    from gymnasium.utils.env_checker import check_env

    from agentrl.registration import make, register

    checked = SWEEnv(instance_ids=[STATS])
    try:
        check_env(checked, skip_render_check=True)  # random text actions are invalid calls, never exceptions
    finally:
        checked.close()

    register("swetest/SWE-v0", "agentrl.envs.swe.env:SWEEnv", kwargs={"instance_ids": [STATS]})
    env = make("swetest/SWE-v0")
    try:
        obs, info = env.reset(seed=3)
        assert info["instance_id"] == STATS
        _, reward, term, _, info = env.step(call("submit", {}))
        assert term and reward == 0.0 and info["resolved"] is False
    finally:
        env.close()
    with pytest.raises(ValueError, match="unknown option"):
        SWEEnv(max_turn=3)
    with pytest.raises(ValueError, match="sandbox: unknown field"):
        SWEEnv(sandbox={"memory": 1})
