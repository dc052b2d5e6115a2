"""Admission, deadlines and staleness: the rules that bound how far rollout runs ahead of training.

Pure bookkeeping (no asyncio, no episodes): :class:`Admission` holds the admission counter and the trainer's
version and answers the manager's questions; :meth:`Admission.select_batch` picks a training batch. The manager
(:mod:`agentrl.manager.manager`) asks, and does the cancelling, replacing and waiting.

Terms: α = ``async_ratio``, B = ``batch_size`` (trajectories the trainer consumes per version), ``v`` the trainer's
version (the step it trains next, :meth:`Admission.set_version`), ``e`` the engine's version (the weights new tokens
come from; ``e <= v`` in a training run, less when weights are synced every ``k > 1`` steps or load slowly) and,
per group, its *admission version* ``a = min(v, e)`` at the moment the group was opened. ``reserved`` is
``accepted + group_size·open``: trajectories delivered in complete groups (and not handed back with ``discard``), plus
``group_size`` for every open group. An open group reserves what it will deliver, ``group_size`` trajectories,
whatever it runs: its over-provisioned members (``extra_per_group``) and replacements never reach the trainer, so
they cost compute, not staleness. With ``extra_per_group: 0`` this is AReaL's count, ``accepted + running``
(running, held and queued members of open groups never exceed ``group_size`` per group).

Rules
1. **Admission** (AReaL's rule, counted in whole groups and against the engine): a group is opened only while
   ``reserved + group_size <= (α + a + 1)·B``. Counting the engine's version rather than the trainer's is what keeps
   a lagging engine (``sync_every > 1``) from admitting work whose tokens are already old when they are generated.
2. **Deadlines**: a group admitted at ``a`` is due at step ``a + α``. Batches are scheduled earliest deadline
   first with a capacity of ``n = B / group_size`` groups per step: the batch for step ``v`` takes the fewest groups
   that keep every later deadline meetable (for each ``d``, the groups due by ``d`` must fit into this batch and the
   ``d − v`` after it), finished ones first, waiting for a running one only when no finished one will do; then it
   fills up with other finished groups in completion order (:meth:`Admission.select_batch`). Taking the fast groups
   first without that check would let old slow groups pile up beyond what one batch can take. A streamed step
   takes its batch one group at a time under the same plan (capacity ``n`` per step, ``n`` minus the groups
   already taken for the rest of this one), so it waits for exactly the groups the whole batch would wait for.
3. **Staleness** (the safety net): a finished trajectory, held winner or running episode whose oldest token version is
   below ``v − α`` is stale: it is cancelled or dropped, counted (``dropped_stale``), replaced within its group, and
   charged to the group's failure budget (``max_failures_per_group``), so a task whose episodes keep going stale is
   eventually given up instead of being resampled until a short episode wins. The rule is suspended while the engine
   serves ``e < v − α``: a restart could not produce fresher tokens.
4. **Resume**: :meth:`Admission.restore` sets ``accepted`` to what the trainer consumed before the checkpoint (``k·B``
   after ``k`` steps) together with ``v = k``, so the ceiling above ``accepted`` is ``(α + 1)·B`` as in a fresh run.

Invariants (``tests/manager/test_admission.py`` drives them without the manager)
- I1 **bound**: after every admission, ``reserved <= (α + a + 1)·B <= (α + v + 1)·B``.
- I2 **deadlines are met**: the groups due by step ``d`` number at most ``(d + 1)·n`` (I1 at their admission, with
  ``a <= d − α``), and ``v·n`` groups were trained before step ``v``; the earliest-deadline-first check keeps, at
  every step, the untrained groups due by ``d`` within ``(d − v + 1)·n``, so every group is trained by its deadline
  and a batch never has to leave a due group behind (when each step takes ``n`` whole groups and none is handed
  back; ``B`` a multiple of ``group_size``).
- I2' **no deadlock**: a trainer waiting at step ``v`` has fewer than ``B / group_size`` groups ready, so
  ``accepted <= v·B + B − group_size`` while the ceiling is at least ``(v + 1)·B`` (``a >= v − α`` when weights
  reach the engine at least every ``α + 1`` steps): there is always room to open the group it waits for.
- I3 **bounded staleness without cancelling**: every token of a group admitted at ``a`` comes from weights ``>= a``
  (the engine's version only grows), and by I2 it is trained at a step ``<= a + α``; so under rules 1-2 rule 3 never
  fires and nothing is dropped for being slow. Trained trajectories are then an unbiased sample of generated
  ones (no length bias), except for over-provisioned members (``extra_per_group``), whose first ``group_size``
  finishers win by design.
- I4 **resume**: after ``restore(k, k·B)`` admission admits exactly what a fresh run at step 0 would.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")


@dataclass
class Admission:
    """The admission counter and version of one manager (see the module docstring for the rules).

    ``alpha`` None disables rules 1-3 (a plain batch or episode run: only ``max_concurrency`` limits admission)."""

    alpha: int | None
    batch_size: int
    accepted: int = 0
    trainer_version: int | None = None  # None: follow the engine (no trainer controller)

    def __post_init__(self) -> None:
        if self.alpha is not None and self.alpha < 0:
            raise ValueError(f"async_ratio must be >= 0 or null, got {self.alpha}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    # ---- versions ------------------------------------------------------------------------------------------
    def version(self, engine_version: int) -> int:
        """Returns ``v``: the trainer's version when set, else the engine's."""
        return int(engine_version) if self.trainer_version is None else self.trainer_version

    def admit_version(self, engine_version: int) -> int:
        """Returns ``a = min(v, e)``, the version a group opened now is admitted at."""
        return min(self.version(engine_version), int(engine_version))

    def set_version(self, v: int) -> None:
        self.trainer_version = int(v)

    def restore(self, version: int, accepted: int) -> None:
        """Continues a run that trained ``version`` steps and consumed ``accepted`` trajectories (rule 4)."""
        if version < 0 or accepted < 0:
            raise ValueError(f"restore needs version >= 0 and accepted >= 0, got {version}, {accepted}")
        self.trainer_version, self.accepted = int(version), int(accepted)

    # ---- rule 1: admission -----------------------------------------------------------------------------------
    def ceiling(self, engine_version: int) -> int | None:
        """Returns ``(α + a + 1)·B``, the most trajectories that may be reserved now (None: no bound)."""
        if self.alpha is None:
            return None
        return (self.alpha + self.admit_version(engine_version) + 1) * self.batch_size

    def fits(self, reserved: int, group_size: int, engine_version: int) -> bool:
        """Whether a group delivering ``group_size`` trajectories may be opened with ``reserved`` already counted."""
        top = self.ceiling(engine_version)
        return top is None or reserved + group_size <= top

    def max_open_groups(self, group_size: int) -> int | None:
        """The most groups open at once under rule 1 (None: no bound): ``group_size·open <= (α + a + 1)·B −
        accepted`` and ``accepted >= v·B >= a·B`` (the trainer consumed ``B`` per step; a consumer's ``discard``
        can lift it for a while), so ``open <= ⌊(α + 1)·B / group_size⌋``."""
        if self.alpha is None:
            return None
        return max(1, (self.alpha + 1) * self.batch_size // group_size)

    def accept(self, n: int) -> None:
        """``n`` trajectories were delivered in a complete group."""
        self.accepted += int(n)

    def discard(self, n: int) -> None:
        """The consumer handed ``n`` delivered trajectories back (or a complete group was reopened)."""
        self.accepted -= int(n)

    # ---- rule 2: deadlines -------------------------------------------------------------------------------------
    def deadline(self, admit_version: int) -> int | None:
        """Returns the last step at which a group admitted at ``admit_version`` may be trained (None: no bound)."""
        return None if self.alpha is None else admit_version + self.alpha

    def select_batch(self, ready: Sequence[T], running: Mapping[int, int], n: int, step: int,
                     admitted: Callable[[T], tuple[int, int]], ended: bool = False, taken: int = 0,
                     want: int | None = None) -> list[T] | None:
        """Picks the batch of ``n`` groups for ``step`` (rule 2). ``ready``: finished groups in completion order;
        ``admitted(g)`` returns ``(admission version, opening order)``; ``running``: how many groups still open were
        admitted at each version.

        Earliest-deadline-first with a capacity of ``n`` groups per step: for every deadline ``d``, the groups due
        by ``d`` must fit into this batch and the ``d − step`` batches after it. The batch takes the fewest groups
        that keeps that true (finished ones first, earliest deadline first); if that needs a group that is still
        running it returns None (the caller waits); then it fills up with other finished groups in completion
        order. Returns None while fewer than ``n`` groups are ready; with ``ended`` (nothing more will finish) it
        returns what there is (None if nothing).

        A streamed step takes its batch in parts: ``taken`` groups of this step's ``n`` were taken already, and
        ``want`` (default: the rest, ``n − taken``) is the size of this part. The capacity planned is still ``n``
        per step, ``n − taken`` for the rest of this one: a part takes the groups that must be in this step, and
        other finished groups only while they leave room for the running groups that must be in it too; it waits
        only when neither is possible (the whole-batch path waits for the same groups)."""
        room = n - taken
        want = room if want is None else min(want, room)
        if want < 1:
            return None
        if len(ready) < want and not ended:
            return None  # the common case while groups finish: nothing to decide yet
        if self.alpha is None:
            return list(ready[:want]) or None
        a = self.alpha
        by_deadline = sorted(ready, key=admitted)
        ready_dl = [admitted(g)[0] + a for g in by_deadline]
        open_dl = sorted((v + a, k) for v, k in running.items() if k > 0)
        must: list[T] = []
        must_running = 0
        for d in sorted(set(ready_dl) | {x for x, _ in open_dl}):
            due_by_d = bisect.bisect_right(ready_dl, d) + sum(k for x, k in open_dl if x <= d)
            need = min(due_by_d - max(0, d - step) * n, room)
            while len(must) + must_running < need:
                if len(must) < len(by_deadline) and ready_dl[len(must)] <= d:
                    must.append(by_deadline[len(must)])
                else:
                    must_running += 1  # the rest has to come from groups still running
        chosen = must[:want]
        # other finished groups, as many as leave room in this step for the running groups that must be in it
        spare = want - len(chosen) if ended else min(want - len(chosen), room - len(must) - must_running)
        ids = {id(g) for g in chosen}
        chosen += [g for g in ready if id(g) not in ids][: max(0, spare)]
        if len(chosen) < want and not ended:
            return None  # a group that has to be in this batch is still running
        return chosen or None

    # ---- rule 3: staleness --------------------------------------------------------------------------------------
    def staleness_applies(self, engine_version: int) -> bool:
        """Whether rule 3 is in force: α is set and the engine serves ``e >= v − α``."""
        return self.alpha is not None and int(engine_version) >= self.version(engine_version) - self.alpha

    def is_stale(self, oldest_version: int | None, engine_version: int) -> bool:
        """Whether tokens as old as ``oldest_version`` (None: no tokens yet) break the bound now (rule 3)."""
        if oldest_version is None or not self.staleness_applies(engine_version):
            return False
        return oldest_version < self.version(engine_version) - self.alpha  # type: ignore[operator]

    def stale_reason(self, oldest_version: int, engine_version: int) -> str:
        return (f"stale: oldest token version {oldest_version} < v - alpha = "
                f"{self.version(engine_version) - (self.alpha or 0)}")
