"""The agent loop and the rollout command on the real vLLM engine with the tiny model (fixtures ``engine`` and
``tiny_model_dir`` from conftest.py: one engine for the whole session)."""

from __future__ import annotations

import json
import math

import pytest
from transformers import AutoTokenizer

from agentrl.inference.base import InferenceEngine
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig
from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig
from agentrl.testing.engine_probe import TokenProbe
from agentrl.trajectory import Trajectory

pytestmark = pytest.mark.engine


class Recording(InferenceEngine):
    """Forwards to the real engine and records (prompt ids, generation) of every request."""

    def __init__(self, inner: InferenceEngine):
        self.inner, self.calls = inner, []

    async def generate(self, prompt_ids, params, *, request_id, session_id=None):
        gen = await self.inner.generate(prompt_ids, params, request_id=request_id, session_id=session_id)
        self.calls.append((session_id, list(prompt_ids), gen))
        return gen

    async def update_weights(self, state_dict, version):
        await self.inner.update_weights(state_dict, version)

    @property
    def version(self):
        return self.inner.version

    async def abort(self, request_id):
        await self.inner.abort(request_id)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


async def test_guess_number_trajectories_are_token_exact(engine, tokenizer):
    rec = Recording(engine)
    cfg = RolloutConfig(temperature=1.0, max_tokens_per_turn=12, seed=3, max_turns=6, max_context_tokens=1024)
    policy = AgentLoopPolicy(rec, tokenizer, cfg)
    specs = [EpisodeSpec("agentrl/GuessNumber-v0", seed=i) for i in range(4)]
    async with EnvManager(ManagerConfig(max_concurrency=4, max_turns=6), policy) as mgr:
        trajs = await mgr.run_episodes(specs)
    im_end, nl = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer("\n", add_special_tokens=False)["input_ids"]
    for t in trajs:
        assert t.termination in ("terminated", "truncated"), t.error
        t.validate()
        Trajectory.from_json(t.to_json()).validate()
        calls = [(p, g) for sid, p, g in rec.calls if sid == t.id]
        assert len(calls) == t.num_turns >= 1
        for prompt, gen in calls:
            # Each request's prompt is exactly the trajectory so far, and the generated ids follow it verbatim.
            n = len(prompt)
            assert t.token_ids[:n] == prompt
            assert t.token_ids[n: n + len(gen.token_ids)] == gen.token_ids
            assert t.loss_mask[n: n + len(gen.token_ids)] == [1] * len(gen.token_ids)
            assert t.logprobs[n: n + len(gen.token_ids)] == pytest.approx(gen.logprobs)
            assert all(v == engine.version for v in gen.versions)
            assert all(math.isfinite(x) and x <= 0 for x in gen.logprobs)
            end = n + len(gen.token_ids)
            # After every assistant turn: the template's closing, whatever made the model stop.
            closing = [im_end] + nl
            k = 1 if gen.token_ids and gen.token_ids[-1] == im_end else 0
            assert t.token_ids[end: end + len(closing) - k] == closing[k:]
        assert t.num_generated == sum(len(g.token_ids) for _, g in calls)
        assert t.prompt_len == len(calls[0][0])
        # Every non-generated stretch after the prompt decodes to template text: closing, env turn, generation prompt.
        text = tokenizer.decode(t.token_ids[t.prompt_len:])
        assert text.count("<|im_start|>assistant\n") == t.num_turns - 1
        assert "<|im_end|><|im_start|>" not in tokenizer.decode(t.token_ids)  # no lost newline between turns


async def test_rollout_command_writes_trajectories(engine, tiny_model_dir, tmp_path, capsys):
    from agentrl.commands.rollout import RolloutRunConfig, run
    from agentrl.config import from_dict

    out = tmp_path / "traj.jsonl"
    cfg = from_dict(RolloutRunConfig, {
        "env": "agentrl/GuessNumber-v0", "episodes": 3, "model": str(tiny_model_dir), "out": str(out),
        "progress": False, "rollout": {"max_tokens_per_turn": 8, "max_turns": 3},
        "manager": {"max_concurrency": 3, "max_turns": 3}}, "test")
    assert await run(cfg, engine=engine) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 3
    trajs = [Trajectory.from_json(line) for line in lines]
    for t in trajs:
        t.validate()
        assert t.env_id == "agentrl/GuessNumber-v0" and t.num_generated > 0 and 1 <= t.num_turns <= 3
        assert t.messages[0]["role"] == "system" and t.messages[-1]["role"] in ("user", "assistant")
    assert sorted(t.seed for t in trajs) == [0, 1, 2]
    assert "3 trajectories" in capsys.readouterr().err
    json.loads(lines[0])  # plain JSON, one object a line


async def test_turn_aborted_by_a_weight_update_is_resubmitted(engine, tiny_model_dir, tokenizer):
    """A weight update in abort mode cuts a turn short; the session resubmits prompt + tokens so far, and the
    tokens keep the version that produced them (0 before the update, 1 after)."""
    import asyncio

    from safetensors.torch import load_file

    from agentrl.policy import EpisodeMeta

    if getattr(engine, "cfg", None) is not None:
        assert engine.cfg.pause_mode == "abort"
    state = load_file(str(tiny_model_dir / "model.safetensors"))  # same weights: only the version label changes
    rec = Recording(engine)
    v0 = engine.version
    budget = min(1000, engine.max_model_len - 64)  # long enough that the update lands mid-turn
    cfg = RolloutConfig(max_tokens_per_turn=budget, ignore_eos=True, max_context_tokens=engine.max_model_len)
    s = AgentLoopPolicy(rec, tokenizer, cfg).session(EpisodeMeta("abort-test", "g", "x", 0))
    with TokenProbe(engine) as probe:
        act = asyncio.create_task(s.act([{"role": "user", "content": "Count to a thousand."}]))
        await probe.wait()  # the turn's first tokens are out, far from its budget
    assert not act.done(), "the turn finished before the weight update: raise the token budget"
    await engine.update_weights(state, v0 + 1)
    a = await act
    assert s.stats["resubmits"] >= 1 and len(rec.calls) >= 2
    (_, p0, g0), (_, p1, g1) = rec.calls[0], rec.calls[1]
    assert g0.finish_reason == "abort" and p1 == p0 + g0.token_ids
    assert len(a.token_ids) == budget and a.finish_reason == "length"
    assert a.versions == sorted(a.versions) and set(a.versions) <= {v0, v0 + 1} and a.versions[-1] == v0 + 1
    assert a.versions[: len(g0.token_ids)] == g0.versions
    rec_ = s.token_record()
    t = Trajectory(id="abort-test", group_id="g", env_id="x", token_ids=rec_.token_ids, loss_mask=rec_.loss_mask,
                   logprobs=rec_.logprobs, versions=rec_.versions, prompt_len=rec_.prompt_len)
    t.validate()
    await s.aclose()
