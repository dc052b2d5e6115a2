"""One episode's lifecycle, from ``queued`` to its trajectory, in the driver::

    open (create + reset in the episode's env worker) ──> act (policy) ──> step (worker) ──> act ──> ...
       ──> terminated | truncated | error | cancelled ──> release (token record, session close, env close)

:class:`EpisodeRunner` runs the body; the manager decides what an ended episode means for its group. Invariants:
the env and the policy session are released before the trajectory is reported, even when the episode task is
cancelled again during the release (the release is shielded); a failure of the env, the policy or the worker ends
the episode with termination ``error`` and a readable ``Trajectory.error``, never an exception out of the runner.
"""

from __future__ import annotations

import asyncio
import collections
import traceback
from typing import TYPE_CHECKING, Any, Callable

from agentrl.manager.config import ManagerConfig
from agentrl.manager.groups import clock
from agentrl.policy import EpisodeMeta, Policy, PolicySession
from agentrl.trajectory import Trajectory
from agentrl.manager.host import INFRA_CAUSES
from agentrl.manager.workers import EnvFailure, EnvWorker, WorkerDied

if TYPE_CHECKING:
    from agentrl.manager.groups import Episode


FAILURE_CAUSES = ("worker_died", "env_make", "env_exception", "env_timeout", "env_protocol", "env_cancelled",
                  "policy_timeout", "policy_error", "episode_timeout") + INFRA_CAUSES
"""Why an episode ended in ``error`` (``Trajectory.info["failure_cause"]``, counted as ``failures/<cause>``). None of
them is the policy's doing as a move in the env: an env that raises, hangs, breaks the contract or loses its host
(its worker, its sandbox, its server), and a policy that cannot answer (its engine or server failed, it timed out).
Such an episode is never scored: it is replaced within its group (:mod:`agentrl.manager.groups`). What the policy
does wrong inside the env (a malformed action, the turn limit) ends the episode normally, with the env's reward.
The infrastructure causes (:data:`~agentrl.manager.host.INFRA_CAUSES`: ``sandbox_lost``, ``sandbox_engine``,
``sandbox_oom``, ``sandbox_disk``) are retried in a fresh env (hence a fresh sandbox) up to ``infra_retries`` times
before they are charged to the group's failure budget."""


class StaleEpisode(Exception):
    """Raised inside an episode whose tokens became too old (``stale_policy: cancel``)."""


class GiveUpGroup(Exception):
    """Raised by a policy session to end its episode and give its whole group up at once, without a retry (e.g. a
    response past tail batching's length budget, :mod:`agentrl.controller.tail`): the episode ends as cancelled, its siblings
    are cancelled, and a batch round (``collect_groups``/``stream_groups``) opens another task in its place."""


def timeout_left(base: float | None, deadline: float | None) -> float | None:
    """Returns the time an awaited call may take: ``base``, capped by what is left until ``deadline``."""
    if deadline is None:
        return base
    left = deadline - clock()
    if left <= 0:
        raise TimeoutError("episode_timeout_s exceeded")
    return left if base is None else min(base, left)


async def with_timeout(aw: Any, timeout: float | None) -> Any:
    if timeout is None:
        return await aw
    if hasattr(asyncio, "timeout"):  # Python >= 3.11
        async with asyncio.timeout(timeout):
            return await aw
    return await asyncio.wait_for(aw, timeout)


class EpisodeRunner:
    """Runs episode bodies for one manager. ``check_tokens(ep)`` is called after every action that carried tokens
    (``ep.oldest_version`` updated); it raises :class:`StaleEpisode` to end the episode as cancelled."""

    def __init__(self, cfg: ManagerConfig, policy: Policy, counts: dict[str, int],
                 check_tokens: Callable[["Episode"], None]):
        self.cfg, self.policy, self.counts, self.check_tokens = cfg, policy, counts, check_tokens
        self.latencies: collections.deque[float] = collections.deque(maxlen=cfg.latency_window)
        self.t0: float | None = None  # when the first episode started

    async def run(self, ep: "Episode") -> None:
        """Runs ``ep`` on ``ep.worker`` and leaves its trajectory in ``ep.result`` (timings included)."""
        cfg, spec, worker = self.cfg, ep.spec, ep.worker
        assert worker is not None
        ep.started = True
        traj = Trajectory(id=ep.id, group_id=ep.group.id, env_id=spec.env_id, seed=spec.seed, task=spec.task)
        t_start = clock()
        if self.t0 is None:
            self.t0 = t_start
        env_s = policy_s = 0.0
        deadline = t_start + cfg.episode_timeout_s if cfg.episode_timeout_s else None
        session: PolicySession | None = None
        opened = False
        cause = ""
        try:
            meta = EpisodeMeta(ep.id, ep.group.id, spec.env_id, spec.seed, spec.task)
            session = self.policy.session(meta)
            options = dict(spec.options or {})
            if spec.task is not None:
                options.setdefault("task", spec.task)
            opened = True
            t = clock()
            try:  # a failed or timed-out call's time is env time too
                new, info = await worker.open(ep.id, spec.env_id, spec.env_kwargs, spec.seed, options or None,
                                              timeout_left(cfg.reset_timeout_s, deadline))
            finally:
                env_s += clock() - t
            traj.messages.extend(new)
            traj.info = info
            state_keys = [info.get("state_key")]  # per turn, the state the action is taken in (agentrl.core)
            if "tools" in info:  # the env's tool schemas, for policies that render them (before the first act)
                meta.tools = info["tools"]  # type: ignore[attr-defined]
            max_turns = spec.max_turns or cfg.max_turns
            termination = "truncated"
            while traj.num_turns < max_turns:
                t = clock()
                action = await with_timeout(session.act(new), timeout_left(cfg.policy_timeout_s, deadline))
                policy_s += clock() - t
                self.counts["policy_calls"] += 1
                if not isinstance(action.text, str):
                    raise TypeError(f"policy returned Action.text of type {type(action.text).__name__}, expected str")
                if action.versions:
                    lo = min(action.versions)
                    ep.oldest_version = lo if ep.oldest_version is None else min(ep.oldest_version, lo)
                    self.check_tokens(ep)
                if action.context_exhausted:
                    if action.text:
                        traj.messages.append({"role": "assistant", "content": action.text})
                    traj.info = {**traj.info, "context_exhausted": True}
                    break
                traj.messages.append({"role": "assistant", "content": action.text})
                t = clock()
                try:
                    new, reward, terminated, truncated, info = await worker.step(
                        ep.id, action.text, timeout_left(cfg.step_timeout_s, deadline))
                finally:
                    dt = clock() - t
                    env_s += dt
                self.latencies.append(dt)
                self.counts["env_steps"] += 1
                traj.rewards.append(reward)
                traj.messages.extend(new)
                traj.num_turns += 1
                traj.info = info
                state_keys.append(info.get("state_key"))
                if terminated or truncated:
                    termination = "terminated" if terminated else "truncated"
                    break
            traj.termination = termination
            if any(k is not None for k in state_keys) and "state_keys" not in traj.info:
                traj.info = {**traj.info, "state_keys": state_keys}
            final = traj.info.get("episode_reward") if isinstance(traj.info, dict) else None
            traj.reward = float(final) if isinstance(final, (int, float)) and not isinstance(final, bool) else float(sum(traj.rewards))
        except asyncio.CancelledError:
            traj.termination, traj.error = "cancelled", ep.cancel_reason or "cancelled"
        except StaleEpisode as e:
            traj.termination, traj.error = "cancelled", str(e)
            ep.cancel_reason = str(e)
        except GiveUpGroup as e:
            traj.termination, traj.error = "cancelled", f"group given up: {e}"
            ep.give_up = True
        except WorkerDied as e:
            ep.worker_died = True
            traj.termination, traj.error = "error", f"WorkerDied({str(e)!r})"
            cause = "worker_died"
        except EnvFailure as e:
            traj.termination = "error"
            traj.error = f"EnvFailure(kind={e.kind!r}, {e.message!r})" + (f"\n{e.traceback_text}" if e.traceback_text else "")
            if e.kind in INFRA_CAUSES:
                cause, ep.infra = e.kind, True
            else:
                cause = f"env_{e.kind}" if f"env_{e.kind}" in FAILURE_CAUSES else "env_exception"
        except (TimeoutError, asyncio.TimeoutError) as e:
            traj.termination, traj.error = "error", f"TimeoutError({str(e) or 'policy_timeout_s exceeded'!r})"
            cause = "episode_timeout" if "episode_timeout_s" in str(e) else "policy_timeout"
        except Exception as e:
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-6)).strip()
            traj.termination, traj.error = "error", f"{e!r}\n{tb}"
            cause = "policy_error"
        if traj.termination == "error":
            traj.info = {**(traj.info if isinstance(traj.info, dict) else {}), "failure_cause": cause}
        traj.timings = {"env_s": env_s, "policy_s": policy_s, "queue_s": t_start - ep.created}
        ep.result = traj
        # The release must finish even if this task is cancelled again meanwhile (a cancel landing here is seen by
        # the manager through ep.cancel_reason): the env and session are released before the trajectory is reported.
        cleanup = asyncio.ensure_future(self._release(ep, traj, session, worker if opened else None))
        while not cleanup.done():
            try:
                await asyncio.shield(cleanup)
            except asyncio.CancelledError:
                continue
        traj.timings["total_s"] = clock() - ep.created

    async def _release(self, ep: "Episode", traj: Trajectory, session: PolicySession | None,
                       worker: EnvWorker | None) -> None:
        if session is not None:
            try:
                rec = session.token_record()
                if rec is not None:
                    traj.token_ids, traj.loss_mask = list(rec.token_ids), list(rec.loss_mask)
                    traj.logprobs, traj.versions = list(rec.logprobs), list(rec.versions)
                    traj.prompt_len = rec.prompt_len
                    traj.segments = list(getattr(rec, "segments", None) or [])
                    traj.info = {**traj.info, **(getattr(rec, "info", None) or {})}
            except Exception as e:
                traj.info = {**traj.info, "token_record_error": repr(e)}
            try:
                await with_timeout(session.aclose(), self.cfg.close_timeout_s)
            except Exception:
                pass
        if worker is not None and worker.alive:
            try:
                await worker.close(ep.id, self.cfg.close_timeout_s)
            except Exception:
                pass
