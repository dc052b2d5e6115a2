"""The in-process vLLM engine (real AsyncLLM on the tiny model): token-in/token-out generation, log-probs,
versions, stops, aborts, and use from several event loops. Fixtures ``engine``/``tiny_model_dir``: conftest.py."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.inference.base import SamplingParams
from agentrl.inference import EngineConfig, make_engine
from agentrl.inference.vllm_engine import VLLMEngine
from agentrl.testing.engine_probe import TokenProbe
from agentrl.testing.procs import descendants

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _prompt(tok, text="What is 12 + 30?"):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


async def test_generate_returns_aligned_tokens_logprobs_versions(engine, tok):
    prompt = _prompt(tok)
    gen = await engine.generate(prompt, SamplingParams(max_tokens=24, ignore_eos=True, seed=1), request_id="eng-basic")
    assert gen.finish_reason == "length"
    assert len(gen.token_ids) == len(gen.logprobs) == len(gen.versions) == 24
    assert all(0 <= t < len(tok) for t in gen.token_ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in gen.logprobs)
    assert gen.versions == [engine.version] * 24


async def test_behavior_logprobs_equal_transformers_logprobs(engine, tok, tiny_model_dir):
    """The log-prob reported with each sampled token is log softmax of the model's logits at temperature 1: the
    float32 trainer recomputes the same numbers (within 1e-4)."""
    prompt = _prompt(tok, "Guess a number between 1 and 100.")
    gen = await engine.generate(prompt, SamplingParams(max_tokens=32, ignore_eos=True, seed=7), request_id="eng-lp")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    seq = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(seq).logits[0].float(), dim=-1)  # [T, V]
    ref = [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(gen.token_ids)]
    assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < 1e-4


async def test_same_seed_same_tokens(engine, tok):
    p = _prompt(tok)
    a = await engine.generate(p, SamplingParams(max_tokens=16, ignore_eos=True, seed=123), request_id="eng-seed-a")
    b = await engine.generate(p, SamplingParams(max_tokens=16, ignore_eos=True, seed=123), request_id="eng-seed-b")
    c = await engine.generate(p, SamplingParams(max_tokens=16, ignore_eos=True, seed=124), request_id="eng-seed-c")
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


async def test_stop_token_ends_generation_and_is_returned(engine, tok):
    p = _prompt(tok)
    # Greedy decoding from a fixed prompt is deterministic: stop on the 4th greedy token.
    free = await engine.generate(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), request_id="eng-stop-a")
    stop_tok = free.token_ids[3]
    first = free.token_ids.index(stop_tok)
    gen = await engine.generate(p, SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_tok]), request_id="eng-stop-b")
    assert gen.finish_reason == "stop"
    assert gen.token_ids == free.token_ids[: first + 1]  # the stop token is part of the output
    assert gen.stop_reason == stop_tok


async def test_text_is_decoded_only_for_requests_with_stop_strings(engine, tok):
    """vLLM decodes each sampled token's text for its log-prob entry and its incremental detokenizer unless asked not
    to; ids and log-probs are all this engine returns, so only a request with stop strings (matched on text) pays
    for it. A stop string still ends generation where its text appears."""
    p = _prompt(tok)
    seen = {}
    orig = engine._llm.output_processor.add_request

    def add_request(request, *args, **kwargs):
        seen[request.request_id] = request.sampling_params.detokenize
        return orig(request, *args, **kwargs)

    engine._llm.output_processor.add_request = add_request
    try:
        free = await engine.generate(p, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                                     request_id="eng-text-a")
        text = tok.decode(free.token_ids)
        stop = text[len(text) // 2:][:3]
        assert stop.strip()
        gen = await engine.generate(p, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop]),
                                    request_id="eng-text-b")
    finally:
        engine._llm.output_processor.add_request = orig
    assert sorted(seen.values()) == [False, True]  # the request without stop strings asked for no text
    assert gen.finish_reason == "stop" and gen.token_ids == free.token_ids[: len(gen.token_ids)]
    assert len(gen.token_ids) < 16 and stop in tok.decode(gen.token_ids) + str(gen.stop_reason)
    assert all(math.isfinite(lp) for lp in free.logprobs + gen.logprobs)


async def test_max_tokens_clamped_to_context_and_overlong_prompt_rejected(engine, tok):
    n = engine.max_model_len - 5
    prompt = (_prompt(tok) * (n // len(_prompt(tok)) + 1))[:n]
    gen = await engine.generate(prompt, SamplingParams(max_tokens=50, ignore_eos=True), request_id="eng-clamp")
    assert gen.finish_reason == "length" and len(gen.token_ids) == 5
    with pytest.raises(ValueError, match="max_model_len"):
        await engine.generate(prompt + [5] * 10, SamplingParams(max_tokens=5), request_id="eng-long")
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], SamplingParams(max_tokens=5), request_id="eng-empty")


async def test_abort_returns_partial_tokens_and_resubmission_continues(engine, tok):
    p = _prompt(tok)
    with TokenProbe(engine, "eng-abort") as probe:
        task = asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=1500, ignore_eos=True),
                                                   request_id="eng-abort"))
        await probe.wait()  # some tokens in, far from 1500
    await engine.abort("eng-abort")
    gen = await asyncio.wait_for(task, 60)
    assert gen.finish_reason == "abort"
    assert 0 < len(gen.token_ids) < 1500
    assert len(gen.logprobs) == len(gen.versions) == len(gen.token_ids)
    more = await engine.generate(p + gen.token_ids, SamplingParams(max_tokens=4, ignore_eos=True), request_id="eng-abort")
    assert more.finish_reason == "length" and len(more.token_ids) == 4  # the id is reusable after it finished


async def test_cancelled_caller_does_not_break_engine(engine, tok):
    p = _prompt(tok)
    with TokenProbe(engine, "eng-cancel") as probe:
        task = asyncio.create_task(engine.generate(p, SamplingParams(max_tokens=1500, ignore_eos=True),
                                                   request_id="eng-cancel"))
        await probe.wait()  # running, far from done
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gen = await engine.generate(p, SamplingParams(max_tokens=3, ignore_eos=True), request_id="eng-after-cancel")
    assert len(gen.token_ids) == 3


async def test_many_concurrent_requests(engine, tok):
    p = _prompt(tok)
    gens = await asyncio.gather(*[
        engine.generate(p, SamplingParams(max_tokens=8 + i % 5, ignore_eos=True, seed=i), request_id=f"eng-conc-{i}")
        for i in range(48)
    ])
    assert [len(g.token_ids) for g in gens] == [8 + i % 5 for i in range(48)]


class OutputCounter:
    """Counts the output objects AsyncLLM yields for each request (``with OutputCounter(engine) as n: ...``)."""

    def __init__(self, engine):
        self.llm, self.counts = engine._llm, {}

    def __enter__(self):
        self.orig = orig = self.llm.generate

        def generate(prompt, params, request_id, *args, **kwargs):
            stream = orig(prompt, params, request_id, *args, **kwargs)

            async def counted():
                async for out in stream:
                    self.counts[request_id] = self.counts.get(request_id, 0) + 1
                    yield out

            return counted()

        self.llm.generate = generate
        return self.counts

    def __exit__(self, *exc):
        self.llm.generate = self.orig


async def test_a_whole_answer_is_not_relayed_token_by_token(engine, tok):
    """A request nobody streams comes back in two output objects (its first token, then the rest at its end), not
    one per engine step: each one costs this process a task wake-up and a hand-over to the caller's loop."""
    with OutputCounter(engine) as counts:
        gen = await engine.generate(_prompt(tok), SamplingParams(max_tokens=24, ignore_eos=True, seed=3),
                                    request_id="eng-whole")
    assert len(gen.token_ids) == len(gen.logprobs) == len(gen.versions) == 24
    assert all(math.isfinite(lp) for lp in gen.logprobs)
    assert counts["eng-whole"] <= 2


async def test_streamed_ids_come_first_at_once_then_stream_interval_at_a_time(engine, tok):
    """``stream_interval`` k: the first id is told as soon as it is sampled, then k at a time, the rest at the end
    (at most 4 tellings of 13 ids for k = 4; fewer when this loop is slow, as vLLM merges the steps a caller has
    not read yet); what was told is the generation, with the same tokens and log-probs as the same seeded request
    unstreamed."""
    p, told = _prompt(tok), []
    for k in (4, 1):
        told.clear()
        params = SamplingParams(max_tokens=13, ignore_eos=True, seed=5, stream_interval=k)
        gen = await engine.generate_streaming(p, params, request_id=f"eng-interval-{k}", on_tokens=told.append)
        assert len(gen.token_ids) == 13 and (k == 1 or len(told) <= 4)
        assert [i for t in told for i in t] == gen.token_ids
        whole = await engine.generate(p, params, request_id=f"eng-interval-whole-{k}")
        assert whole.token_ids == gen.token_ids
        assert max(abs(a - b) for a, b in zip(whole.logprobs, gen.logprobs)) < 1e-5
    with pytest.raises(ValueError, match="stream_interval must be >= 1"):
        await engine.generate_streaming(p, SamplingParams(stream_interval=0), request_id="eng-interval-0",
                                        on_tokens=told.append)


async def test_seeded_prompts_over_one_steps_token_budget_do_not_kill_the_engine(engine, tok):
    """vLLM splits prefills that do not fit one step's token budget (2,048 on the CPU) and then rewinds each split
    request's generator by an offset, which torch's CPU generator does not have: one seeded request in a split step
    ("CPU Generator does not use offset") killed the engine core. The agent loop seeds every request, so a long
    context, or many contexts arriving at once, took the CPU engine down."""
    prompts = [[10 + (i * 7 + j) % 200 for j in range(600)] for i in range(6)]  # 3,600 distinct prompt tokens
    gens = await asyncio.gather(*[
        engine.generate(p, SamplingParams(max_tokens=4, ignore_eos=True, seed=i), request_id=f"eng-split-{i}")
        for i, p in enumerate(prompts)
    ])
    assert [len(g.token_ids) for g in gens] == [4] * 6
    again = await engine.generate(prompts[2], SamplingParams(max_tokens=4, ignore_eos=True, seed=2),
                                  request_id="eng-split-again")
    assert again.token_ids == gens[2].token_ids  # seeded: the same tokens alone as in the crowded step


def test_usable_from_another_thread_and_event_loop(engine, tok):
    p = _prompt(tok)
    out = {}

    def worker():
        out["gen"] = asyncio.run(engine.generate(p, SamplingParams(max_tokens=5, ignore_eos=True), request_id="eng-thread"))

    t = threading.Thread(target=worker)
    t.start()
    t.join(60)
    assert len(out["gen"].token_ids) == 5


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="urls"):
        make_engine(EngineConfig(backend="remote"))
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        make_engine(EngineConfig(gpu_memory_utilization=1.5))
    with pytest.raises(ValueError, match="max_model_len"):
        EngineConfig(max_model_len=4).validate()
    with pytest.raises(ValueError, match="executor"):
        EngineConfig(executor="in_core", tensor_parallel_size=2).validate()


def test_in_core_engine_runs_the_model_without_a_worker_process(engine):
    """The suite's engine uses ``executor: in_core`` (it starts ~15 s sooner on the CPU): vLLM keeps the model in
    the engine-core process (vLLM CPU would turn its name "uni" into a worker process of its own)."""
    from agentrl.inference import orphan_guard

    assert engine.cfg.executor == "in_core"
    (core,) = orphan_guard.engine_core_pids(engine._llm)
    assert core != os.getpid()
    backend = engine._llm.vllm_config.parallel_config.distributed_executor_backend
    assert getattr(backend, "__name__", backend) == "UniProcExecutor"
    assert not [c for c in descendants(core).values() if "multiprocessing" in c or "Worker" in c]


async def test_a_cpu_engine_forks_its_worker_and_samples_what_the_in_core_engine_samples(engine, tiny_model_dir, tok):
    """``executor: auto`` on a CPU host: the engine core is forked from this process and the worker from the engine
    core (vLLM CPU would spawn both, each importing vLLM and torch again, ~10 s), and the worker samples the same
    tokens and log-probs as the model run inside the engine core."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    from agentrl.inference import orphan_guard

    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=2048, pause_mode="abort", seed=0))
    try:
        (core,) = orphan_guard.engine_core_pids(eng._llm)
        assert os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "fork"  # asked of the engine core's start only
        (worker,) = await eng._on_engine(eng._llm.collective_rpc("agentrl_process"))
        assert worker["forked_from"] == core
        assert worker["core_forked_from"] == os.getpid()
        # bound as vLLM binds a spawned worker, not left on the engine core's threads and cores
        (cpus,) = OMPProcessManager(eng._llm.vllm_config).cpu_lists
        assert (worker["threads"], worker["cpus"]) == (len(cpus), sorted(cpus))
        params = SamplingParams(max_tokens=16, ignore_eos=True, seed=7)
        ours, theirs = await asyncio.gather(eng.generate(_prompt(tok), params, request_id="forked"),
                                            engine.generate(_prompt(tok), params, request_id="in-core"))
        assert ours.token_ids == theirs.token_ids
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
    finally:
        eng.close_sync()


def test_in_core_engine_core_exits_by_itself_when_closed(tiny_model_dir):
    """Closing an engine ends its engine-core process; vLLM kills it only if it has not exited 5 s after its
    teardown began. Its interpreter's last collection used to take longer than that (every close took 5.0 s)."""
    eng = VLLMEngine(EngineConfig(model=str(tiny_model_dir), max_model_len=512, seed=0, executor="in_core"))
    (proc,) = eng._llm.engine_core.resources.engine_manager.processes
    eng.close_sync()
    assert proc.exitcode is not None and proc.exitcode != -signal.SIGKILL, proc.exitcode


def test_startup_heap_is_frozen_out_of_the_collector(engine):
    """The model-loading heap is frozen once the engine is up (as vLLM's API server does): a full collection then
    walks only what the run allocates, not the ~0.5 s of startup objects that stalled the event loop."""
    import gc

    assert gc.get_freeze_count() > 100_000
