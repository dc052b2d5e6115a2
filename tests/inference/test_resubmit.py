"""The abort-and-resubmit rule (agentrl.inference.resubmit), shared by the agent loop and the gateway, against a
scripted engine: what is resubmitted, what every token keeps, and what is refused."""

from __future__ import annotations

import math

import pytest

from agentrl.inference.base import Generation, SamplingParams
from agentrl.inference.resubmit import BadGeneration, ResubmitError, derive_seed, generate_resubmitting


class ScriptedEngine:
    """Returns the scripted generations in order and records each request (prompt, max_tokens, seed, id)."""

    def __init__(self, script: list[Generation]):
        self.script, self.calls = list(script), []

    async def generate(self, prompt, params, *, request_id, session_id=None):
        self.calls.append((list(prompt), params.max_tokens, params.seed, request_id))
        return self.script.pop(0)


def gen(ids, version, reason, lp=-0.5):
    return Generation(token_ids=list(ids), logprobs=[lp] * len(ids), versions=[version] * len(ids),
                      finish_reason=reason)


async def test_an_aborted_request_is_resubmitted_with_the_tokens_so_far_and_keeps_their_versions():
    eng = ScriptedEngine([gen([5, 6], 3, "abort"), gen([7], 4, "abort"), gen([8, 9], 4, "stop")])
    seen = []
    out, resubmits = await generate_resubmitting(
        eng, [1, 2], SamplingParams(max_tokens=6, seed=7), request_id=lambda a: f"r{a}", session_id="s",
        max_resubmits=5, seed=lambda a: derive_seed(7, "x", a), on_request=seen.append)
    assert out.token_ids == [5, 6, 7, 8, 9] and out.versions == [3, 3, 4, 4, 4] and out.finish_reason == "stop"
    assert resubmits == 2
    assert [c[0] for c in eng.calls] == [[1, 2], [1, 2, 5, 6], [1, 2, 5, 6, 7]]  # prompt + tokens so far
    assert [c[1] for c in eng.calls] == [6, 4, 3]  # the remaining budget
    assert len({c[2] for c in eng.calls}) == 3 and [c[3] for c in eng.calls] == ["r0", "r1", "r2"]
    assert seen == ["r0", None, "r1", None, "r2", None]  # the request in flight, for the caller's abort


async def test_a_closed_caller_stops_resubmitting_and_a_spent_budget_is_length():
    eng = ScriptedEngine([gen([5], 1, "abort")])
    out, n = await generate_resubmitting(eng, [1], SamplingParams(max_tokens=4), request_id=str, session_id=None,
                                         max_resubmits=3, closed=lambda: True)
    assert out.finish_reason == "abort" and n == 0
    eng = ScriptedEngine([gen([5, 6], 1, "abort")])
    out, _ = await generate_resubmitting(eng, [1], SamplingParams(max_tokens=2), request_id=str, session_id=None,
                                         max_resubmits=3)
    assert out.finish_reason == "length" and out.token_ids == [5, 6] and len(eng.calls) == 1


@pytest.mark.parametrize("bad, match", [
    (Generation([5, 6], [-0.1], [1, 1], "stop"), "misaligned"),
    (Generation([5], [-0.1], [-1], "stop"), "unversioned"),
    (Generation([0], [math.nan], [1], "stop"), "non-finite log-prob"),
    (Generation([0], [-math.inf], [1], "stop"), "non-finite log-prob"),
])
async def test_bad_generations_are_refused(bad, match):
    with pytest.raises(BadGeneration, match=match):
        await generate_resubmitting(ScriptedEngine([bad]), [1], SamplingParams(max_tokens=4), request_id=str,
                                    session_id=None, max_resubmits=0)


async def test_too_many_aborts_is_an_error():
    eng = ScriptedEngine([gen([5], 1, "abort")] * 3)
    with pytest.raises(ResubmitError, match="aborted 3 times"):
        await generate_resubmitting(eng, [1], SamplingParams(max_tokens=8), request_id=str, session_id=None,
                                    max_resubmits=2)
