"""Engine replicas (``engine.replicas: 2``): two real vLLM engines in Ray actors behind one router, started once for
this module with ``weight_sync: gloo`` so both weight paths run: the state dict through Ray's object store, and the
trainer-side broadcast through vLLM's weight-transfer API (agentrl's gloo backend, the CPU twin of vLLM's NCCL one).

Every test leaves both replicas with the original weights and uses versions above ``engine.version``. The last
test kills a replica; keep it last."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import signal
import socket

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.inference.base import SamplingParams
from agentrl.testing.engine_probe import count_replica_tokens, replica_requests, replica_tokens

pytestmark = pytest.mark.engine

TOL = 1e-4


@pytest.fixture(scope="module")
def eng(tiny_model_dir):
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.inference.replicas import ReplicatedEngine

    e = make_engine(EngineConfig(model=str(tiny_model_dir), replicas=2, weight_sync="gloo", max_model_len=1024,
                                 pause_mode="abort", seed=0, executor="in_core"))
    assert isinstance(e, ReplicatedEngine)
    try:
        yield e
    finally:
        e.close_sync()


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def original(tiny_model_dir):
    return load_file(str(tiny_model_dir / "model.safetensors"))


def _prompt(tok, text="Count to ten."):
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def _perturbed(original, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in original.items()}


def _hf_logprobs(model_dir, state_dict, seq):
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.load_state_dict(state_dict, strict=False)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), dim=-1)
    return [logp[i, seq[i + 1]].item() for i in range(len(seq) - 1)]


async def _until(probe, what, timeout):
    """``await probe()`` every 20 ms until it returns something true (a loaded machine may take seconds), then that
    value; fails naming ``what`` after ``timeout`` seconds."""
    end = asyncio.get_running_loop().time() + timeout
    while not (found := await probe()):
        assert asyncio.get_running_loop().time() < end, f"{what} after {timeout} s"
        await asyncio.sleep(0.02)
    return found


async def _until_tokens(eng, replica, request_id, timeout=300.0):
    """Waits until ``request_id`` has produced tokens on ``replica``."""
    await _until(lambda: eng.replicas[replica].__ray_call__.remote(replica_tokens, request_id),
                 f"no tokens of {request_id}", timeout)


async def _until_held(eng, replica, timeout=300.0):
    """Waits until ``replica``'s engine holds a request (added, not finished)."""
    await _until(lambda: eng.replicas[replica].__ray_call__.remote(replica_requests),
                 f"replica {replica} got no request", timeout)


async def _routed_replica(eng, session_id, timeout=60.0):
    """The replica the router picked for ``session_id`` (it picks when the request is sent)."""
    async def routed():
        r = eng.replica_for(session_id)
        return None if r is None else (r,)  # a 1-tuple: replica 0 is a valid answer

    return (await _until(routed, f"{session_id!r} was not routed", timeout))[0]


async def _restore(eng, original):
    await eng.update_weights(original, eng.version + 1)


async def test_sessions_spread_and_stick_with_exact_versions(eng, tok):
    p = _prompt(tok)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    first = await asyncio.gather(*[eng.generate(p, sp, request_id=f"rep-a{i}", session_id=f"traj{i}") for i in range(8)])
    pins = [eng.replica_for(f"traj{i}") for i in range(8)]
    assert sorted(pins) == [0, 0, 0, 0, 1, 1, 1, 1]  # least in flight: the two replicas share the load
    for g in first:
        assert len(g.token_ids) == len(g.logprobs) == len(g.versions) == 12
        assert g.versions == [eng.version] * 12 and all(math.isfinite(x) and x <= 0 for x in g.logprobs)
    # Second turns go where the first went (prefix cache), even while that replica is the busier one.
    for r in eng.replicas:
        await r.__ray_call__.remote(count_replica_tokens)
    busy = asyncio.create_task(eng.generate(p, SamplingParams(max_tokens=200, ignore_eos=True), request_id="rep-busy",
                                            session_id="traj0"))
    await _until_tokens(eng, pins[0], "rep-busy")
    second = await asyncio.gather(*[eng.generate(p + first[i].token_ids, sp, request_id=f"rep-b{i}", session_id=f"traj{i}")
                                    for i in range(8)])
    assert [eng.replica_for(f"traj{i}") for i in range(8)] == pins
    assert all(g.versions == [eng.version] * 12 for g in second)
    await busy
    assert await eng.replica_versions() == [eng.version, eng.version]
    with pytest.raises(ValueError, match="max_model_len"):
        await eng.generate([5] * 1024, sp, request_id="rep-long")


async def test_state_dict_update_reaches_every_replica(eng, tok, original, tiny_model_dir):
    seq = _prompt(tok) + tok("Sure: one, two, three.", add_special_tokens=False)["input_ids"]
    digest0 = await eng.weights_digest()  # raises if the replicas disagree
    new = _perturbed(original, seed=11)
    v = eng.version + 1
    try:
        await eng.update_weights(dict(new, **{"lm_head.weight": new["model.embed_tokens.weight"]}), v)
        assert eng.version == v and await eng.replica_versions() == [v, v]
        assert await eng.weights_digest() != digest0
        ref = _hf_logprobs(tiny_model_dir, new, seq)
        for r in (0, 1):
            assert max(abs(a - b) for a, b in zip(await eng.prompt_logprobs(seq, replica=r), ref)) < TOL
        gens = await asyncio.gather(*[eng.generate(seq, SamplingParams(max_tokens=4, ignore_eos=True),
                                                   request_id=f"rep-new{i}", session_id=f"new{i}") for i in range(4)])
        assert {eng.replica_for(f"new{i}") for i in range(4)} == {0, 1}
        assert all(g.versions == [v] * 4 for g in gens)
        # A bad state dict is refused before any replica pauses; nothing changes.
        with pytest.raises(ValueError, match="missing tensors"):
            await eng.update_weights({"model.norm.weight": original["model.norm.weight"]}, v + 1)
        assert eng.version == v and await eng.replica_versions() == [v, v]
        # A state dict already in the object store (what the trainer hands over: agentrl.controller.weights) is
        # read there by the replicas; the returned size is one replica's payload.
        import ray

        nbytes = await eng.update_weights(ray.put(original), v + 1)
        assert eng.version == v + 1 and await eng.replica_versions() == [v + 1, v + 1]
        assert await eng.weights_digest() == digest0
        assert nbytes >= sum(t.numel() for t in original.values()) * 2  # at least bf16 bytes per element
    finally:
        await _restore(eng, original)
    assert await eng.weights_digest() == digest0


async def test_abort_mode_update_pauses_all_replicas(eng, tok, original):
    """In-flight requests on both replicas return their tokens so far with the old version; their continuations
    (same replica, sticky) carry the new one."""
    p = _prompt(tok)
    v = eng.version
    long = SamplingParams(max_tokens=900, ignore_eos=True)
    for r in eng.replicas:
        await r.__ray_call__.remote(count_replica_tokens)
    tasks = [asyncio.create_task(eng.generate(p, long, request_id=f"rep-ab{i}", session_id=f"ab{i}")) for i in range(2)]
    await asyncio.sleep(0)  # routed
    assert {eng.replica_for("ab0"), eng.replica_for("ab1")} == {0, 1}
    for i in range(2):  # both requests are mid-generation: some tokens out, far from 900
        await _until_tokens(eng, eng.replica_for(f"ab{i}"), f"rep-ab{i}")
    try:
        await eng.update_weights(_perturbed(original, seed=12), v + 1)
        gens = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        for i, g in enumerate(gens):
            assert g.finish_reason == "abort" and 0 < len(g.token_ids) < 900
            assert g.versions == [v] * len(g.token_ids)
            cont = await eng.generate(p + g.token_ids, SamplingParams(max_tokens=3, ignore_eos=True),
                                      request_id=f"rep-ab{i}", session_id=f"ab{i}")
            assert cont.versions == [v + 1] * 3
    finally:
        await _restore(eng, original)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_trainer_broadcast_through_vllm_weight_transfer(eng, tok, original, tiny_model_dir):
    """The trainer side of vLLM's weight-transfer API (here: in this process, gloo) broadcasts a model's
    parameters to both replicas: they pause, receive, finish, and serve the new weights only once the driver
    commits the version. A wrong update is refused before anything pauses."""
    from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory

    from agentrl.inference.weight_transfer import trainer_init_info  # (also registers agentrl_gloo here)

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    new = _perturbed(original, seed=13)
    model.load_state_dict(new, strict=False)
    info = trainer_init_info(**eng.trainer_init_args("127.0.0.1", _free_port()))
    assert info.world_size == 3  # the sender and one worker per replica
    sender = await asyncio.to_thread(WeightTransferTrainerFactory.trainer_init, info,
                                     client=eng.weight_sync_client(), source=ModuleSource(model))
    v = eng.version
    seq = _prompt(tok) + tok("One, two.", add_special_tokens=False)["input_ids"]
    try:
        await asyncio.to_thread(sender.send_weights)
        assert eng.version == v and await eng.replica_versions() == [v, v]  # received, not yet committed
        # Paused until the commit: a request sent now is served by the new weights, labelled v + 1.
        for r in eng.replicas:
            await r.__ray_call__.remote(count_replica_tokens)
        pending = asyncio.create_task(eng.generate(seq, SamplingParams(max_tokens=5, ignore_eos=True),
                                                   request_id="rep-bc", session_id="bc"))
        await _until_held(eng, await _routed_replica(eng, "bc"))  # inside a paused engine, not on its way there
        assert not pending.done() and await eng.replicas[eng.replica_for("bc")].__ray_call__.remote(
            replica_tokens, "rep-bc") == 0
        await eng.commit_weight_update(v + 1)
        assert (await asyncio.wait_for(pending, 60)).versions == [v + 1] * 5
        assert await eng.replica_versions() == [v + 1, v + 1]
        ref = _hf_logprobs(tiny_model_dir, new, seq)
        for r in (0, 1):
            assert max(abs(a - b) for a, b in zip(await eng.prompt_logprobs(seq, replica=r), ref)) < TOL

        # Names that do not fit the served model: refused by the engine before any replica pauses or waits.
        class Renamed(ModuleSource):
            def metadata(self):
                return [dataclasses.replace(m, name=m.name.replace("mlp", "ffn")) for m in super().metadata()]

        bad = await asyncio.to_thread(WeightTransferTrainerFactory.trainer_init,
                                      trainer_init_info(**eng.trainer_init_args("127.0.0.1", _free_port())),
                                      client=eng.weight_sync_client(), source=Renamed(model))
        with pytest.raises(ValueError, match="unknown tensors"):
            await asyncio.to_thread(bad.send_weights)
        g = await eng.generate(seq, SamplingParams(max_tokens=2, ignore_eos=True), request_id="rep-after-bad")
        assert g.versions == [v + 1] * 2
    finally:
        await _restore(eng, original)


async def test_streaming_tells_each_step_as_the_replica_makes_it(eng, tok):
    """The gateway's path through replicas: ids come back while the request runs (the first one told aborts it,
    so a stream delivered only at the end would have all 1,000 tokens), and what was told is the generation."""
    p = _prompt(tok)
    told: list[list[int]] = []

    def on_tokens(ids: list[int]) -> None:
        told.append(list(ids))
        if len(told) == 1:
            asyncio.get_running_loop().create_task(eng.abort("st-1"))

    gen = await eng.generate_streaming(p, SamplingParams(max_tokens=1000, ignore_eos=True), request_id="st-1",
                                       session_id="st", on_tokens=on_tokens)
    assert gen.finish_reason == "abort" and 0 < len(gen.token_ids) < 1000
    assert [t for ids in told for t in ids] == gen.token_ids
    assert gen.versions == [eng.version] * len(gen.token_ids)
    whole: list[int] = []
    full = await eng.generate_streaming(p, SamplingParams(max_tokens=12, ignore_eos=True), request_id="st-2",
                                        on_tokens=whole.extend)
    assert whole == full.token_ids and len(full.token_ids) == 12 and full.finish_reason == "length"
    assert eng._where == {}  # both requests left the router's books


async def test_trajectory_moving_to_another_replica_keeps_exact_versions(eng, tok, original):
    """A replica's engine core dies (killed, as the OOM killer does) while a trajectory's turn is on it: the actor
    exits, the turn is retried on the other replica (nothing of the lost request was returned) and every token keeps
    the version of the replica that made it. Updates go on with the survivor. Before, the actor outlived its
    engine and every request routed to it failed. (Kills a replica: the last test of this module.)"""
    import psutil
    import ray

    p = _prompt(tok)
    v0 = eng.version
    turn1 = await eng.generate(p, SamplingParams(max_tokens=6, ignore_eos=True), request_id="mv-1", session_id="mv")
    home = eng.replica_for("mv")
    assert turn1.versions == [v0] * 6
    await eng.update_weights(_perturbed(original, seed=14), v0 + 1)
    pid = ray.get(eng.replicas[home].node_info.remote())["pid"]
    children = _children(pid)
    # The home replica is frozen (keep mode) before the turn reaches it, so the turn cannot finish there before the
    # kill lands, however fast the machine.
    await eng.replicas[home].pause.remote("keep")
    turn2_task = asyncio.create_task(eng.generate(p + turn1.token_ids, SamplingParams(max_tokens=300, ignore_eos=True),
                                                  request_id="mv-2", session_id="mv"))
    while eng._where.get("mv-2") != home and not turn2_task.done():  # routed (the router picks before its first await)
        await asyncio.sleep(0)
    await eng.replicas[home].node_info.remote()  # an actor runs one caller's calls in order: generate has started
    assert not turn2_task.done()
    # the engine core: vLLM names it VLLM::EngineCore (a title not every read of /proc shows); else the child that
    # holds the model, the largest
    procs = [psutil.Process(c) for c in children]
    named = [p for p in procs if "EngineCore" in p.name() + " ".join(p.cmdline())]
    core = named[0] if named else max(procs, key=lambda p: p.memory_info().rss)
    os.kill(core.pid, signal.SIGKILL)
    try:
        turn2 = await asyncio.wait_for(turn2_task, 180)
        assert eng.replica_for("mv") == 1 - home and eng.alive[home] is False and eng.dead() is None
        assert turn2.finish_reason == "length" and turn2.versions == [v0 + 1] * 300
        versions = turn1.versions + turn2.versions
        assert versions == [v0] * 6 + [v0 + 1] * 300
        await eng.update_weights(original, v0 + 2)  # the survivor alone
        assert eng.version == v0 + 2 and await eng.replica_versions() == [v0 + 2]
    finally:
        for c in children:  # the dead replica's vLLM engine-core process, if Ray left it behind
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
