"""Group bookkeeping: which episodes belong to which group, when a group is complete, and what an ended episode
means for its group.

A *round* is one producer: a batch (``collect_groups``: ``target`` groups), single episodes (``stream_episodes``)
or a continuous run (``start``: no target). It opens groups from its task source; each group launches
``launch_size`` members (``group_size + extra_per_group``) and moves through::

    open ──(group_size winners)──> ready ──(taken by the consumer)──> done
     │  ▲                             │
     │  └──(a winner went stale: reopened, continuous runs only)─┘
     └──(failure budget spent: abandoned; round closed; target reached)──> done

Invariants
- ``held`` equals the number of winners of open groups; a ready group holds exactly ``group_size`` winners and
  counts as accepted for admission (taking it keeps it accepted, reopening it un-counts it).
- An episode that ends while its group is open is exactly one of: a winner; replaced (an error, a dead worker or
  stale tokens: charged to the group's failure budget, except a dead worker's and the first ``infra_retries``
  infrastructure failures of a member and its replacements); or the end of its group (budget spent: abandoned). An episode that ends after its group left ``open``, or after it was cancelled as a loser (even if
  the cancel landed while it was releasing its env), is never a winner: it counts as ``surplus`` or ``cancelled``.
- A trajectory is delivered at most once and every trajectory id is unique (``<group id>.<attempt>``).
- Cancelled losers' tasks stay in ``round.reap`` until their env is closed; a round ends only after awaiting them.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from typing import Callable

from agentrl.manager.admission import Admission
from agentrl.manager.config import EpisodeSpec, ManagerConfig, ManagerError, TaskSource
from agentrl.trajectory import Group, Trajectory


def clock() -> float:
    """The running event loop's clock (``time.monotonic`` on a real loop): deadlines and timings follow the loop's
    time, so on a virtual clock (``agentrl simulate``) an episode times out in simulated seconds."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()

OPEN, READY, DONE = "open", "ready", "done"


class Episode:
    """One attempt at one group member (queued, running or ended)."""

    __slots__ = ("id", "group", "spec", "created", "task", "worker", "cancel_reason", "oldest_version", "stale",
                 "worker_died", "result", "started", "give_up", "infra", "infra_tries")

    def __init__(self, group: "GroupState", infra_tries: int = 0):
        self.group, self.spec = group, group.spec
        self.id = f"{group.tag}.{next(group.attempts)}"
        self.created = clock()
        self.task: asyncio.Task | None = None
        self.worker = None
        self.cancel_reason: str | None = None
        self.oldest_version: int | None = None
        self.stale = False  # stale_policy "drop": runs to its end, then is dropped
        self.worker_died = False
        self.result: Trajectory | None = None
        self.started = False
        self.give_up = False  # the policy gave the group up (GiveUpGroup)
        self.infra = False  # ended by an infrastructure failure (its sandbox lost, killed, OOM, disk full)
        self.infra_tries = infra_tries  # infrastructure failures of the attempts this one retries


class GroupState:
    __slots__ = ("id", "tag", "spec", "round", "index", "winners", "live", "pending", "attempts", "failures", "state",
                 "last_error", "admit_version")

    def __init__(self, gid: str, spec: EpisodeSpec, rnd: "Round", index: int, admit_version: int, tag: str = ""):
        self.id, self.spec, self.round, self.index = gid, spec, rnd, index
        self.tag = tag or gid  # episode ids are "<tag>.<attempt>": unique even when specs share a group id
        self.admit_version = admit_version
        self.winners: list[Trajectory] = []
        self.live: set[Episode] = set()
        self.pending = 0
        self.attempts = itertools.count()
        self.failures = 0
        self.state = OPEN
        self.last_error: Trajectory | None = None

    @property
    def key(self) -> str:
        return f"{self.id}#{self.index}"

    def as_group(self) -> Group:
        return Group(self.id, self.winners[: self.round.group_size])


class Round:
    """One producer: a batch (``target`` groups), single episodes (``deliver_failed``) or a continuous run."""

    def __init__(self, source: TaskSource, group_size: int, launch_size: int, target: int | None,
                 deliver_failed: bool, to_open: int | None):
        if callable(source):
            self._next: Callable[[], EpisodeSpec | None] = source
        else:
            it = iter(source)
            self._next = lambda: next(it, None)
        self.group_size, self.launch_size, self.target = group_size, launch_size, target
        self.deliver_failed = deliver_failed
        self.open: dict[str, GroupState] = {}
        self.open_versions: collections.Counter[int] = collections.Counter()  # open groups by admission version
        self.ready: list[GroupState] = []  # complete, not yet taken, in completion order
        self.delivered = 0  # groups that became ready (a target round closes at its target)
        self.exhausted = False
        self.closed = False  # no more groups become ready
        self.stopped = False  # the round ended (stop, or the batch was complete)
        self.count = itertools.count()
        self.reap: set[asyncio.Task] = set()  # cancelled losers still closing their envs
        self.to_open = to_open  # groups still to open (None: unbounded, continuous mode)
        self.dropped: list[str] = []  # ids of groups ended without delivery (abandoned, given up), not yet taken
        # Group ids seen in a bounded round: specs given to run_episodes may share one, their episodes must not.
        self.gids: collections.Counter[str] | None = collections.Counter() if to_open is not None else None
        self.changed = asyncio.Event()

    def add_open(self, g: "GroupState") -> None:
        self.open[g.key] = g
        self.open_versions[g.admit_version] += 1

    def remove_open(self, g: "GroupState") -> None:
        if self.open.pop(g.key, None) is not None:
            self.open_versions[g.admit_version] -= 1

    def next_spec(self) -> EpisodeSpec | None:
        if self.exhausted:
            return None
        spec = self._next()
        if spec is None:
            self.exhausted = True
        elif not isinstance(spec, EpisodeSpec):
            raise ManagerError(f"task source yielded {type(spec).__name__}, expected EpisodeSpec")
        return spec

    @property
    def finished(self) -> bool:
        """No further group can become ready."""
        return self.stopped or self.closed or (self.exhausted and not self.open)

    def wake(self) -> None:
        self.changed.set()

    async def changes(self) -> None:
        """Waits for the next state change (call right after checking the state, with no await in between)."""
        self.changed.clear()
        await self.changed.wait()


def oldest_version(traj: Trajectory) -> int | None:
    r = traj.version_range()
    return r[0] if r is not None else None


class GroupBook:
    """The groups of the manager's rounds: opening, replacing, completing, abandoning, reopening.

    ``cancel(ep, reason)`` cancels a running episode and returns its task; ``engine_version()`` the version the
    policy serves now. ``pending`` holds queued episodes (the manager starts them), ``held`` counts winners of open
    groups, ``failed`` keeps recent error trajectories."""

    def __init__(self, cfg: ManagerConfig, admission: Admission, counts: dict[str, int],
                 engine_version: Callable[[], int], cancel: Callable[[Episode, str], "asyncio.Task | None"],
                 prefix: str):
        self.cfg, self.admission, self.counts = cfg, admission, counts
        self.engine_version, self.cancel = engine_version, cancel
        self.pending: collections.deque[Episode] = collections.deque()
        self.held = 0
        self.failed: collections.deque[Trajectory] = collections.deque(maxlen=cfg.failed_history)
        self._prefix = prefix
        self._gcount = itertools.count()

    # ---- opening --------------------------------------------------------------------------------------------
    def open_group(self, r: Round) -> GroupState | None:
        """Takes the next spec of ``r`` and queues its ``launch_size`` members; None when the source ran out."""
        spec = r.next_spec()
        if spec is None:
            return None
        gid = spec.group_id or f"{self._prefix}-g{next(self._gcount)}"
        tag = gid
        if r.gids is not None:
            seen = r.gids[gid]
            r.gids[gid] += 1
            tag = f"{gid}~{seen}" if seen else gid
        g = GroupState(gid, spec, r, next(r.count), self.admission.admit_version(self.engine_version()), tag)
        r.add_open(g)
        for _ in range(r.launch_size):
            self.enqueue(g)
        return g

    def enqueue(self, g: GroupState, front: bool = False, infra_tries: int = 0) -> None:
        ep = Episode(g, infra_tries)
        g.pending += 1
        if front:
            self.pending.appendleft(ep)
        else:
            self.pending.append(ep)

    # ---- an episode ended -------------------------------------------------------------------------------------
    def episode_ended(self, ep: Episode, traj: Trajectory) -> None:
        """Counts ``traj`` and applies what it means for its group (see the module invariants)."""
        g, c, term = ep.group, self.counts, traj.termination
        finished = term in ("terminated", "truncated")
        if term == "cancelled":
            c["cancelled"] += 1
        elif term == "error":
            c["failed"] += 1
            cause = traj.info.get("failure_cause", "policy_error") if isinstance(traj.info, dict) else "policy_error"
            c[f"failures/{cause}"] = c.get(f"failures/{cause}", 0) + 1
            self.failed.append(traj)
        else:
            c["finished"] += 1
        stale_cancel = (ep.cancel_reason or "").startswith("stale")
        if g.state != OPEN or (ep.cancel_reason is not None and not stale_cancel):
            if finished:
                c["surplus"] += 1  # a loser, also when its cancel landed while it was releasing its env
            return
        if term == "cancelled":
            if stale_cancel:
                self._stale(g)
            elif ep.give_up:
                self.give_up(g)
            return
        if term == "error":
            g.last_error = traj
            if ep.worker_died:
                c["rescheduled"] += 1
                self._replace(g)
            elif ep.infra and ep.infra_tries < self.cfg.infra_retries:
                c["infra_retried"] += 1  # a fresh env, so a fresh sandbox; not charged to the failure budget
                self._replace(g, ep.infra_tries + 1)
            else:
                self._retry(g, "replaced", ep.infra_tries)
            return
        if ep.stale or stale_cancel or self.admission.is_stale(ep.oldest_version, self.engine_version()):
            self._stale(g)
            return
        g.winners.append(traj)
        self.held += 1
        if len(g.winners) >= g.round.group_size:
            self.complete(g)

    def _stale(self, g: GroupState) -> None:
        self.counts["dropped_stale"] += 1
        self._retry(g, None)

    def _retry(self, g: GroupState, counter: str | None, infra_tries: int = 0) -> None:
        """Charges a failed or stale attempt to ``g``: a replacement (inheriting the attempt's ``infra_tries``, so
        that infrastructure retries stay bounded across replacements), or the end of the group once its budget is
        spent (a task whose episodes keep failing or going stale is not resampled for ever)."""
        g.failures += 1
        if g.failures > self.cfg.max_failures_per_group:
            self.abandon(g)
            return
        if counter:
            self.counts[counter] += 1
        self._replace(g, infra_tries)

    def _replace(self, g: GroupState, infra_tries: int = 0) -> None:
        if not g.round.closed:
            self.enqueue(g, front=True, infra_tries=infra_tries)

    # ---- group transitions ------------------------------------------------------------------------------------
    def _cancel_live(self, g: GroupState, reason: str) -> None:
        for ep in list(g.live):
            t = self.cancel(ep, reason)
            if t is not None and not t.done():
                g.round.reap.add(t)
                t.add_done_callback(g.round.reap.discard)

    def _leave_open(self, g: GroupState, state: str) -> None:
        g.round.remove_open(g)
        self.held -= len(g.winners)
        g.state = state

    def complete(self, g: GroupState) -> None:
        """``g`` has ``group_size`` winners: it becomes ready (or surplus once its round is closed) and its other
        members are cancelled."""
        r = g.round
        self._leave_open(g, DONE)
        self._cancel_live(g, "redundant: its group already has group_size finished episodes")
        if r.closed:
            self.counts["surplus"] += len(g.winners)
            return
        g.winners = g.winners[: r.group_size]
        self._make_ready(g)
        if not r.deliver_failed:  # plain episode runs (stream_episodes) are not training batches
            self.admission.accept(len(g.winners))

    def _make_ready(self, g: GroupState) -> None:
        r = g.round
        g.state = READY
        r.ready.append(g)
        r.delivered += 1
        self.counts["delivered_groups"] += 1
        if r.target is not None and r.delivered >= r.target:
            r.closed = True
        r.wake()

    def finish(self, g: GroupState, reason: str) -> None:
        """Ends an open group without delivering it: its winners become surplus, its live members are cancelled."""
        if g.state != OPEN:
            return
        self.counts["surplus"] += len(g.winners)
        self._leave_open(g, DONE)
        self._cancel_live(g, reason)

    def abandon(self, g: GroupState) -> None:
        r = g.round
        self.finish(g, "abandoned: its group failed too often")
        self.counts["failed_groups"] += 1
        if not r.deliver_failed:
            r.dropped.append(g.id)
        if r.deliver_failed and g.last_error is not None and not r.closed:
            g.winners = [g.last_error]
            self._make_ready(g)
            return
        if r.target is not None and not r.closed:
            r.to_open = (r.to_open or 0) + 1  # take another task from the source
        r.wake()

    def give_up(self, g: GroupState) -> None:
        """Ends ``g`` at its policy's request (no retry); a target round opens another task instead."""
        r = g.round
        self.finish(g, "given up: a sibling's policy gave the group up")
        self.counts["given_up_groups"] += 1
        r.dropped.append(g.id)
        if r.target is not None and not r.closed:
            r.to_open = (r.to_open or 0) + 1
        r.wake()

    def take(self, r: Round, chosen: list[GroupState]) -> list[Group]:
        """Removes ``chosen`` from ``r.ready`` and returns them as delivered groups."""
        ids = {id(g) for g in chosen}
        r.ready = [g for g in r.ready if id(g) not in ids]
        for g in chosen:
            g.state = DONE
        return [g.as_group() for g in chosen]

    # ---- rule 3 after a version change -------------------------------------------------------------------------
    def restale(self, r: Round) -> None:
        """Applies the staleness rule to ``r`` at the current version: running episodes (cancelled, or marked to be
        dropped at their end), held winners (dropped and replaced) and, in a continuous run, ready groups (reopened
        with their stale winners replaced)."""
        adm, e = self.admission, self.engine_version()
        if not adm.staleness_applies(e):
            return
        for g in list(r.open.values()):
            self._drop_stale_winners(g)
            for ep in list(g.live):
                if adm.is_stale(ep.oldest_version, e):
                    if self.cfg.stale_policy == "cancel":
                        self.cancel(ep, adm.stale_reason(ep.oldest_version, e))  # type: ignore[arg-type]
                    else:
                        ep.stale = True
        if r.target is None:
            for g in list(r.ready):
                if any(adm.is_stale(oldest_version(t), e) for t in g.winners):
                    r.ready.remove(g)
                    r.delivered -= 1
                    self.counts["delivered_groups"] -= 1
                    adm.discard(len(g.winners))
                    g.state = OPEN
                    r.add_open(g)
                    self.held += len(g.winners)
                    self._drop_stale_winners(g)

    def _drop_stale_winners(self, g: GroupState) -> None:
        e = self.engine_version()
        stale = [t for t in g.winners if self.admission.is_stale(oldest_version(t), e)]
        if not stale:
            return
        gone = {id(t) for t in stale}
        g.winners = [t for t in g.winners if id(t) not in gone]
        self.held -= len(stale)
        for _ in stale:
            if g.state != OPEN:
                break
            self._stale(g)
