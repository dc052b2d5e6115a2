"""``run_eval``: lists the instances, skips those recorded, runs the rest through the environment manager with a
bounded number alive, and writes trajectories, predictions and the report (see :mod:`agentrl.eval`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.eval.config import PREDICTIONS, TRAJECTORIES, EvalConfig
from agentrl.eval.instances import Instance, _ensure_registered, episode_spec, list_instances
from agentrl.eval.policies import BuiltPolicy, build_policy
from agentrl.eval.records import JsonlLog, episode_record, prediction_of, summarize, write_report
from agentrl.policy import Policy


async def _quietly(coro: Any) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        pass


# ---------------------------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    report: dict[str, Any]
    out: Path
    ran: int  # episodes run by this call
    skipped: int  # instances found already done
    stopped: str | None = None  # why the run stopped before the end (the policy's engine died), None if it did not


def run_eval(cfg: EvalConfig, policy: Policy | None = None) -> EvalResult:
    """Runs ``cfg`` (see the module docstring) and returns the report. ``policy`` overrides ``cfg.policy``.

    A ``KeyboardInterrupt`` (Ctrl-C) stops the run after cancelling the live episodes (their envs are closed);
    the files stay consistent, the report is written, and the interrupt propagates."""
    cfg.validate()
    return asyncio.run(_run(cfg, policy))


async def _run(cfg: EvalConfig, given: Policy | None) -> EvalResult:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    instances: list[Instance] = []
    expected: dict[str, int] = {}
    for entry in cfg.entries():
        insts = list_instances(entry, cfg.limit, cfg.seed)
        expected[entry.label] = len(insts)
        instances += insts

    traj_log, pred_log = JsonlLog(out / TRAJECTORIES), JsonlLog(out / PREDICTIONS)
    records = traj_log.open()
    # One record per key: the last (a key has two only when retry_errors appended a new result after an error).
    # Records of keys no longer listed (a smaller limit) stay in the file but are not reported.
    wanted = {i.key for i in instances}
    done: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        done[(r.get("env"), r.get("instance_id"))] = r
    retry = {k for k, r in done.items() if cfg.retry_errors and r.get("termination") == "error"}
    model_name = cfg.policy.model_name
    _repair_predictions(pred_log, list(done.values()), retry, model_name)

    todo = [i for i in instances if i.key not in done or i.key in retry]
    for k in retry:
        done.pop(k, None)
    skipped = len(instances) - len(todo)

    built = BuiltPolicy(given) if given is not None else None
    t0 = time.monotonic()
    ran = 0
    stopped: str | None = None
    bar = _progress(cfg, len(instances), [r for k, r in done.items() if k in wanted])
    try:
        if todo:
            from agentrl.manager import EnvManager, ManagerConfig

            if built is None:
                kwargs_by_env: dict[str, dict[str, Any]] = {}
                for e in cfg.entries():
                    kwargs_by_env.setdefault(e.id, dict(e.kwargs))
                built = build_policy(cfg.policy, kwargs_by_env)
            for inst in todo:
                _ensure_registered(inst.env_id)
            mcfg = ManagerConfig(workers=cfg.workers, max_concurrency=cfg.concurrency, max_turns=cfg.max_turns,
                                 max_failures_per_group=cfg.retries, episode_timeout_s=cfg.episode_timeout_s)
            async with EnvManager(mcfg, built.policy) as mgr:
                specs = [episode_spec(i, cfg.max_episode_steps) for i in todo]
                async for k, traj in mgr.stream_episodes(specs):
                    if traj.termination == "cancelled":
                        continue  # not a result: run again next time
                    if traj.termination == "error" and built.dead is not None and (stopped := built.dead()):
                        break  # not a result either: every episode left would fail the same way
                    inst = todo[k]
                    rec = episode_record(inst, traj)
                    # Trajectory first, then prediction, with no await between: a cancel cannot split them.
                    traj_log.append(rec)
                    pred = prediction_of(rec, model_name)
                    if pred is not None:
                        pred_log.append(pred)
                    done[inst.key] = rec
                    ran += 1
                    if bar is not None:
                        bar.update(rec)
    finally:
        if bar is not None:
            bar.close()
        traj_log.close()
        pred_log.close()
        if built is not None and built.close is not None and given is None:
            await _quietly(built.close())
        report = summarize([r for k, r in done.items() if k in wanted], expected, time.monotonic() - t0, model_name)
        write_report(out, report)
    return EvalResult(report=report, out=out, ran=ran, skipped=skipped, stopped=stopped)


def _repair_predictions(log: JsonlLog, records: list[dict[str, Any]], retry: set, model_name: str) -> None:
    """Makes ``predictions.jsonl`` hold exactly one prediction per recorded SWE instance (not being retried)."""
    preds = log.open()
    want: dict[str, dict[str, Any]] = {}
    for r in records:
        if (r.get("env"), r.get("instance_id")) in retry:
            continue
        p = prediction_of(r, model_name)
        if p is not None:
            want.setdefault(p["instance_id"], p)
    have = {}
    for p in preds:
        have.setdefault(p.get("instance_id"), p)
    if len(preds) != len(have) or set(have) != set(want):
        log.rewrite([have.get(i, p) for i, p in want.items()])


class _Progress:
    """A tqdm bar over all instances (resumed ones count as done) showing successes and the running accuracy."""

    def __init__(self, total: int, done: list[dict[str, Any]]):
        from tqdm import tqdm

        self.n = len(done)
        self.success = sum(1 for r in done if r.get("success"))
        self.bar = tqdm(total=total, initial=self.n, desc="eval", unit="inst", dynamic_ncols=True)
        self._post()

    def _post(self) -> None:
        acc = self.success / self.n if self.n else 0.0
        self.bar.set_postfix_str(f"ok={self.success}/{self.n} acc={100 * acc:.1f}%", refresh=False)

    def update(self, record: dict[str, Any]) -> None:
        self.n += 1
        self.success += bool(record.get("success"))
        self._post()
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _progress(cfg: EvalConfig, total: int, done: list[dict[str, Any]]) -> _Progress | None:
    return _Progress(total, done) if cfg.progress else None
