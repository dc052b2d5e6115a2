"""Simulated runs: the cost models, and the real controller on them giving the timeline their costs imply."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agentrl.simulate import VirtualTimeLoop, run_virtual
from agentrl.simulate.models import EngineModel, ResponseModel, SimEngine, SimEnv, SimTrainer, TrainerModel
from agentrl.simulate.run import SimulationConfig, simulate


def _two_requests(eng: SimEngine, prompt: int = 1000, tokens: int = 4):
    async def main():
        return await asyncio.gather(eng.generate_tokens(prompt, tokens), eng.generate_tokens(prompt, tokens))

    return run_virtual(main())


def test_the_engine_serialises_prefill_and_charges_batch_dependent_decode_steps():
    eng = SimEngine(EngineModel(prefill_s_per_token=0.001, decode_step_s=0.1, decode_step_s_per_seq=0.05, chunk=1))
    (va, vb), took = _two_requests(eng)
    # a: prefill 0-1, then 4 steps at batch 2 (b holds its slot while it waits for the prefill): 4 x 0.2 -> 1.8;
    # b: prefill 1-2, then 4 steps alone: 4 x 0.15 -> 2.6
    assert took == pytest.approx(2.6) and va == vb == [0, 0, 0, 0] and eng.busy_s(took) == pytest.approx(2.6)
    assert eng.mean_batch(took) == pytest.approx((2 * 1.8 + 1 * 0.8) / 2.6)


def test_replicas_run_requests_side_by_side():
    eng = SimEngine(EngineModel(replicas=2, prefill_s_per_token=0.001, decode_step_s=0.1,
                                decode_step_s_per_seq=0.05, chunk=1))
    _, took = _two_requests(eng)
    assert took == pytest.approx(1.0 + 4 * 0.15)  # one request a replica, in parallel


def test_decode_steps_grow_with_context_and_the_prefix_cache_skips_known_tokens():
    eng = SimEngine(EngineModel(prefill_s_per_token=0.001, decode_step_s=0.0, decode_step_s_per_ktoken=0.1, chunk=1))

    async def main():
        return await eng.generate_tokens(1000, 2, cached_tokens=900)

    _, took = run_virtual(main())
    # prefill of the 100 new tokens (0.1 s), then steps reading 1000 and 1001 tokens of KV cache
    assert took == pytest.approx(0.1 + 0.1 + 0.1001)
    eng = SimEngine(EngineModel(prefill_s_per_token=0.001, decode_step_s=0.0, prefix_cache=False, chunk=1))
    _, took = run_virtual(eng.generate_tokens(1000, 2, cached_tokens=900))
    assert took == pytest.approx(1.0)


def test_a_weight_sync_pauses_decoding_and_later_tokens_carry_the_new_version():
    eng = SimEngine(EngineModel(decode_step_s=1.0, sync_s=3.0, chunk=1))

    async def main():
        req = asyncio.create_task(eng.generate_tokens(0, 5))
        await asyncio.sleep(2.5)
        await eng.update_weights({}, 1)  # 2.5-5.5; the step under way (2-3) finishes with version 0
        return await req

    versions, took = run_virtual(main())
    assert versions == [0, 0, 0, 1, 1] and took == pytest.approx(5.5 + 2)


def test_a_colocated_trainer_pauses_the_engine_and_a_shared_one_slows_it():
    groups = [type("G", (), {"trajectories": [type("T", (), {"token_ids": [0] * 10, "versions": [0] * 10,
                                                             "loss_mask": [1] * 10})()]})()]

    def run(exclusive: bool, slowdown: float):
        eng = SimEngine(EngineModel(decode_step_s=1.0, chunk=1, slowdown_while_training=slowdown))
        tr = SimTrainer(TrainerModel(flops_per_token=0.4, peak_flops=1.0, mfu=1.0, exclusive=exclusive), eng)

        async def main():
            req = asyncio.create_task(eng.generate_tokens(0, 6))
            await asyncio.sleep(0.5)
            await tr.train_step.remote(groups)  # 4 s of training from 0.5
            return await req

        return run_virtual(main())[1]

    # paused: steps at 0-1, then the engine waits for the step (0.5-4.5): 5 more steps from 4.5 -> 9.5
    assert run(True, 1.0) == pytest.approx(9.5)
    # shared, 2x slower while training (0.5-4.5): steps 0-1, 1-3, 3-5 (the last two start while training), then
    # 5-6, 6-7, 7-8
    assert run(False, 2.0) == pytest.approx(8.0)
    assert run(False, 1.0) == pytest.approx(6.0)


def test_a_shared_trainer_is_slowed_while_an_episode_is_in_flight_even_between_engine_requests():
    # On shared CPU cores the driver's agent loops compete with the trainer between engine requests too: the CPU
    # validation's streamed and alpha=2 runs were underpredicted by 11-21 % while only decoding slowed the trainer.
    from agentrl.policy import EpisodeMeta
    from agentrl.simulate.models import ResponseModel, SimPolicy

    groups = [type("G", (), {"trajectories": [type("T", (), {"token_ids": [0] * 10, "versions": [0] * 10,
                                                             "loss_mask": [1] * 10})()]})()]

    def run(open_episode: bool) -> float:
        eng = SimEngine(EngineModel(decode_step_s=1.0, chunk=1))
        tr = SimTrainer(TrainerModel(flops_per_token=0.4, peak_flops=1.0, mfu=1.0, slowdown_while_generating=3.0),
                        eng)
        policy = SimPolicy(eng, ResponseModel())

        async def main():
            session = policy.session(EpisodeMeta(trajectory_id="t", group_id="g", env_id="e", seed=0)) if open_episode else None
            await tr.train_step.remote(groups)  # 4 s alone; no engine request runs during it
            if session is not None:
                await session.aclose()
                await session.aclose()  # closing twice counts once
            assert eng.episodes == 0

        return run_virtual(main())[1]

    assert run(False) == pytest.approx(4.0)
    assert run(True) == pytest.approx(12.0)


def test_a_shared_trainers_slowdown_grows_with_the_requests_the_engine_is_running():
    # On 2 shared cores the trainer's slowdown beside a rollout measured 2.1x with rollouts of 64 episodes and 3.2x
    # with 128 kept in flight: one factor for "a rollout is in flight" cannot serve both the alpha=2 run (128 in
    # flight) and a streamed one (a draining batch of 64). Slowdown = slowdown_while_generating + per request running.
    groups = [type("G", (), {"trajectories": [type("T", (), {"token_ids": [0] * 10, "versions": [0] * 10,
                                                             "loss_mask": [1] * 10})()]})()]

    def run(requests: int) -> float:
        eng = SimEngine(EngineModel(decode_step_s=1.0, chunk=1))
        tr = SimTrainer(TrainerModel(flops_per_token=0.4, peak_flops=1.0, mfu=1.0, slowdown_while_generating=1.5,
                                     slowdown_per_running_request=0.25), eng)

        async def main():
            gens = [asyncio.ensure_future(eng.generate_tokens(1, 100)) for _ in range(requests)]
            await asyncio.sleep(0)  # the requests take their slots
            t0 = asyncio.get_running_loop().time()
            await tr.train_step.remote(groups)  # 4 s alone
            took = asyncio.get_running_loop().time() - t0
            for g in gens:
                g.cancel()
            await asyncio.gather(*gens, return_exceptions=True)
            return took

        return run_virtual(main())[0]

    assert run(0) == pytest.approx(4.0)
    assert run(2) == pytest.approx(4.0 * (1.5 + 2 * 0.25))
    assert run(4) == pytest.approx(4.0 * (1.5 + 4 * 0.25))
    with pytest.raises(ValueError, match="slowdown_per_running_request"):
        TrainerModel(slowdown_per_running_request=-0.1).validate()


def test_the_trainers_calls_run_one_at_a_time_in_the_order_they_were_made():
    # The real trainer is a Ray actor (one thread): the streamed steps' accumulate calls, sent as groups finish
    # without waiting for the previous one, queue there. Run side by side, the simulated streamed variant was 14-21 %
    # faster than the real one.
    groups = [type("G", (), {"trajectories": [type("T", (), {"token_ids": [0] * 10, "versions": [0] * 10,
                                                             "loss_mask": [1] * 10})()]})()]
    tr = SimTrainer(TrainerModel(flops_per_token=0.1, peak_flops=1.0, mfu=1.0, step_overhead_s=0.5))
    ended: list[tuple[str, float]] = []

    async def call(name: str, fut) -> None:
        await fut
        ended.append((name, asyncio.get_running_loop().time()))

    async def main():
        await tr.start_step.remote()
        calls = [asyncio.ensure_future(call(f"acc{i}", tr.accumulate.remote(groups))) for i in range(3)]
        await call("finish", tr.finish_step.remote())
        await asyncio.gather(*calls)

    _, took = run_virtual(main())
    assert ended == [("acc0", pytest.approx(1.0)), ("acc1", pytest.approx(2.0)), ("acc2", pytest.approx(3.0)),
                     ("finish", pytest.approx(3.5))]
    assert took == pytest.approx(3.5) and tr.busy_s == pytest.approx(3.5) and tr.version == 1


def test_a_padding_trainer_charges_the_body_per_padded_token_and_the_head_per_real_token():
    def traj(n: int):
        return type("T", (), {"token_ids": [0] * n, "versions": [0] * n, "loss_mask": [1] * n})()

    groups = [type("G", (), {"trajectories": [traj(n) for n in (2, 10, 2, 2)]})()]
    padded = TrainerModel(flops_per_token=0.1, head_flops_per_token=0.01, peak_flops=1.0, mfu=1.0, micro_batch_size=2)
    # sorted 10, 2 | 2, 2: 2 x 10 + 2 x 2 = 24 padded tokens; 16 real
    assert padded.padded_tokens([2, 10, 2, 2]) == 24
    packed = TrainerModel(flops_per_token=0.1, head_flops_per_token=0.01, peak_flops=1.0, mfu=1.0)

    def run(model: TrainerModel) -> float:
        tr = SimTrainer(model)

        async def main():
            await tr.train_step.remote(groups)

        return run_virtual(main())[1]

    assert run(padded) == pytest.approx(24 * 0.1 + 16 * 0.01)
    assert run(packed) == pytest.approx(16 * 0.1 + 16 * 0.01)
    with pytest.raises(ValueError, match="micro_batch_size"):
        TrainerModel(micro_batch_size=-1).validate()


def test_env_latency_caps_fail_slow_steps_and_validation():
    env = SimEnv(latency=1.0, latency_dist="fixed", slow_prob=1.0, slow_factor=10.0)
    assert env.latency_s() == 10.0
    env = SimEnv(latency=5.0, latency_sigma=5.0, latency_dist="lognormal", latency_max=2.0)
    assert max(env.latency_s() for _ in range(200)) <= 2.0
    with pytest.raises(ValueError, match="latency_dist"):
        SimEnv(latency_dist="weibull")
    with pytest.raises(ValueError, match="slow_prob"):
        SimEnv(slow_prob=1.5)
    with pytest.raises(ValueError, match="engine.replicas"):
        EngineModel(replicas=0).validate()
    with pytest.raises(ValueError, match="trainer.mfu"):
        TrainerModel(mfu=0).validate()
    for field, value, rule in (("response_mean", -5, "> 0"), ("max_response", 0, ">= 1"), ("prompt_tokens", -1, ">= 0"),
                               ("obs_tokens", -2, ">= 0")):  # the field and the value given, as every other check
        with pytest.raises(ValueError, match=f"^response.{field} must be {rule}, got {value}$"):
            ResponseModel(**{field: value}).validate()


def test_lockstep_envs_step_together():
    from agentrl.simulate.models import Lockstep

    bar, log = Lockstep(), []

    async def member(name: str, work: list[float]) -> None:
        bar.join()
        for w in work:
            await asyncio.sleep(w)
            await bar.wait()
            log.append((asyncio.get_running_loop().time(), name))
        bar.leave()

    async def main():
        await asyncio.gather(member("a", [1.0, 1.0, 1.0]), member("b", [3.0, 0.5]))

    _, took = run_virtual(main())
    # phase 1 opens when b arrives (3); phase 2 at 4 (a's 1 s; b's 0.5 s); b leaves, a alone: 5
    assert sorted(log) == [(3.0, "a"), (3.0, "b"), (4.0, "a"), (4.0, "b"), (5.0, "a")] and took == 5.0


def test_a_simulated_run_takes_the_time_its_costs_imply():
    # a step: 1 turn (10 tokens x 0.1 s decode + 2 s env) = 3 s of rollout, then 4 x 10 tokens x 0.1 s = 4 s of
    # training; synchronous (alpha 0): 3 steps x 7 s.
    sim = SimulationConfig(
        run={"steps": 3, "async_ratio": 0, "manager": {"num_groups": 2, "group_size": 2, "max_turns": 4},
             "env": {"id": "sim/Env-v0", "kwargs": {"turns": 1, "latency": 2.0}}},
        engine=EngineModel(decode_step_s=0.1, chunk=1),
        trainer=TrainerModel(flops_per_token=0.1, peak_flops=1.0, mfu=1.0, gpus=1),
        response=ResponseModel(response_mean=10, prompt_tokens=0))
    r = simulate(sim)
    assert r["wall_s"] == pytest.approx(21.0) and r["staleness"] == {0: 1.0}
    assert r["trainer_busy_frac"] == pytest.approx(12 / 21)
    assert [len(t) for t in r["tasks"]] == [2, 2, 2]


def test_env_level_asynchrony_beats_lockstep_under_slow_envs():
    def run(lockstep: bool) -> float:
        return simulate(SimulationConfig(
            run={"steps": 3, "async_ratio": 0, "manager": {"num_groups": 4, "group_size": 4, "max_turns": 8},
                 "env": {"id": "sim/Env-v0", "kwargs": {"turns": 3, "latency": 10.0, "latency_sigma": 10.0,
                                                        "latency_dist": "normal", "lockstep": lockstep}}},
            engine=EngineModel(decode_step_s=0.01), response=ResponseModel(response_mean=100, prompt_tokens=0)),
            seed=1)["wall_s"]

    locked, free = run(True), run(False)
    # lock-step: every turn waits for the slowest of 16 draws of N(10, 10) (about 2 sigma above the mean);
    # env-level: an episode waits for its own 3 draws
    assert locked > 1.15 * free  # (expected ratio ~1.35: E[sum of per-turn maxima] / E[max of per-episode sums])


def test_episode_timeouts_run_on_the_simulated_clock():
    # 10 s env steps, episode_timeout_s 15: only one-turn episodes (10 s) finish; longer ones time out and their
    # groups are retried until their members draw one turn. (On the wall clock, the simulated episodes took
    # milliseconds and never timed out.)
    sim = SimulationConfig(
        run={"steps": 2, "async_ratio": 0, "manager": {"num_groups": 2, "group_size": 2, "max_turns": 8,
                                                       "episode_timeout_s": 15.0},
             "env": {"id": "sim/Env-v0", "kwargs": {"turns": 2, "turns_sigma": 1.5, "latency": 10.0}}},
        engine=EngineModel(decode_step_s=0.01, chunk=1),
        response=ResponseModel(response_mean=10, prompt_tokens=0, obs_tokens=0))
    r = simulate(sim)
    assert r["trained_tokens"] == 2 * 4 * 10  # one turn of 10 tokens each


def test_episodes_replay_a_runs_logged_trajectories(tmp_path):
    log = tmp_path / "trajectories.jsonl"
    log.write_text("\n".join(json.dumps({"summary": {"turns": 3, "generated": 13, "tokens": 99}})
                             for _ in range(5)) + "\n")
    sim = SimulationConfig(
        run={"steps": 2, "async_ratio": 0, "manager": {"num_groups": 2, "group_size": 2, "max_turns": 8},
             "env": {"id": "sim/Env-v0", "kwargs": {"turns": 0}}},
        engine=EngineModel(decode_step_s=0.01, chunk=1),
        response=ResponseModel(prompt_tokens=20, obs_tokens=5, trajectories=str(log)))
    r = simulate(sim)
    # every episode: 3 turns of 5 + 4 + 4 generated tokens, prompt 20 and 2 observations of 5: 43 tokens
    assert r["trained_tokens"] == 2 * 4 * 43
    assert r["engine_requests"] >= 2 * 4 * 3  # (plus the first turns of episodes admitted as the run ends)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        simulate(SimulationConfig(run=sim.run, response=ResponseModel(trajectories=str(bad))))


def test_the_cli_sweeps_a_grid_against_a_baseline_and_plots(capsys, tmp_path):
    from agentrl.cli import main

    png = tmp_path / "s.png"
    rc = main(["simulate", "configs/simulate_env_latency.yaml", "run.steps=3",
               "run.manager.num_groups=2", "run.manager.group_size=2", "--sweep", "run.async_ratio=1,0",
               "--sweep", "engine.sync_s=0,5", "--baseline", "run.async_ratio=0", "--json", "--plot", str(png)])
    assert rc == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [(r["run.async_ratio"], r["engine.sync_s"]) for r in rows] == [("1", "0"), ("1", "5"), ("0", "0"),
                                                                        ("0", "5")]
    by = {(r["run.async_ratio"], r["engine.sync_s"]): r for r in rows}
    for s in ("0", "5"):  # each point against the synchronous run with the same sync cost
        assert by[("1", s)]["speedup"] == pytest.approx(by[("0", s)]["wall_s"] / by[("1", s)]["wall_s"])
        assert by[("0", s)]["speedup"] == 1.0 and by[("1", s)]["speedup"] > 1  # slow envs: running ahead pays
    assert max(int(k) for k in by[("1", "0")]["staleness"]) <= 1 and list(by[("0", "0")]["staleness"]) == ["0"]
    assert png.stat().st_size > 1000
    assert main(["simulate", "configs/simulate_env_latency.yaml", "--baseline", "nokey"]) == 2
    assert main(["simulate", "configs/simulate_env_latency.yaml", "engine.replicas=0"]) == 2


def test_zero_cost_runs_decide_the_same_on_the_virtual_and_a_real_clock():
    """A simulated run whose models cost nothing is decided by event order alone: on a real event loop the same
    seeds admit, cancel and train the same tasks at the same steps, with the same staleness. (Zero cost includes the
    trajectory log's thread work, which the virtual loop runs inline; a real thread would finish at a load-dependent
    point among the callbacks, and the real loop's own decisions would vary from run to run.)"""
    class RealLoop(asyncio.SelectorEventLoop):  # real time; only the executor work is made instant
        run_in_executor = VirtualTimeLoop.run_in_executor

    def real_loop(coro):
        loop = RealLoop()
        t0 = time.perf_counter()
        try:
            return loop.run_until_complete(coro), time.perf_counter() - t0
        finally:
            loop.close()

    for extra, spare in (({"async_ratio": 2}, 1), ({"async_ratio": 1, "streaming": True}, 1),
                         ({"async_ratio": 0, "tail_batching": {"enabled": True, "length_budget": 24}}, 0)):
        sim = SimulationConfig(
            run={"steps": 4, "manager": {"num_groups": 3, "group_size": 2, "max_turns": 6, "extra_groups": spare},
                 "env": {"id": "sim/Env-v0", "kwargs": {"turns": 3, "turns_sigma": 2.0}}, **extra},
            engine=EngineModel(decode_step_s=0.0), trainer=TrainerModel(flops_per_token=0.0),
            response=ResponseModel(response_mean=8, response_sigma=8, task_share=0.5, prompt_tokens=4))
        virtual = simulate(sim, seed=3)
        real = simulate(sim, seed=3, runner=real_loop)
        assert virtual["wall_s"] == 0.0 and len(virtual["tasks"]) == 4
        assert virtual["tasks"] == real["tasks"] and virtual["staleness"] == real["staleness"], extra
        assert simulate(sim, seed=3)["tasks"] == virtual["tasks"]  # and a second simulation agrees
        assert virtual["engine_requests"] == real["engine_requests"] and virtual["trained_tokens"] == real["trained_tokens"]
