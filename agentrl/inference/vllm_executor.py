"""vLLM's processes forked, not spawned, on CPU hosts: the engine core from the driver, its worker from the engine core.

vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` unconditionally, so the worker process imports
vLLM and torch again from nothing: ~10-13 s of one core before it loads the model, on the 2-core machines a third
of an engine's start-up, taken from the trainer and Ray that start beside it. Forked from the engine core (which
has imported all of it by then) the worker is up in ~2 s. This is vLLM's own default on GPU hosts (``fork`` unless
CUDA is initialised), and the engine core forks from the same state there: its IO threads start only after the
executor is made. Spawn is left to vLLM where it insists (a Ray actor, NUMA binding).

One thing spawn did that a fork must redo: vLLM binds each CPU worker's OpenMP threads through the environment it
starts the worker with (``OMP_NUM_THREADS`` and ``OMP_PLACES``, or ``GOMP_CPU_AFFINITY`` / ``KMP_AFFINITY`` when
that runtime is preloaded), which a fresh OpenMP runtime reads once at load. A forked worker inherits the engine
core's runtime, already loaded, so it would run unbound on every core (on 2 cores: two threads fighting the engine
core's busy loop, ~30 % fewer tokens/s). The child applies the same binding itself, from the same variables, before
its first parallel region.

The engine core itself is forked from the driver (:func:`start_llm`) for the same reason: spawned, it imports vLLM
and torch afresh (~9 s of a core on the critical path, while the driver has both imported). vLLM forks it on GPU
hosts too, from drivers that run Ray as ours do. The child runs only vLLM's code and leaves by ``os._exit``; what
it inherits and never uses (Ray's sockets, the driver's other threads' state) goes with it.

Lives in the engine-core process too: vLLM pickles the executor class by reference and imports it there.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

from vllm.v1.executor.multiproc_executor import MultiprocExecutor

FORKED_FROM: int | None = None
"""In a worker, the engine core's pid when the worker was forked from it (the module is then already imported);
``None`` in a spawned worker, which imports this module afresh."""

CORE_FORKED_FROM: int | None = None
"""In an engine core (and its forked worker), the driver's pid when the core was forked from it; else None."""


def omp_binding(env: dict[str, str] | os._Environ) -> tuple[int, list[int]] | None:
    """(threads, cpus) that vLLM's ``OMPProcessManager.configure_omp_envs`` asked of a worker through ``env``;
    None when it asked nothing (``VLLM_CPU_OMP_THREADS_BIND=nobind``, or not a CPU host)."""
    if "OMP_NUM_THREADS" not in env:
        return None
    if "KMP_AFFINITY" in env:  # "granularity=fine,explicit,proclist=[0,1]"
        m = re.search(r"proclist=\[([\d,\s]*)\]", env["KMP_AFFINITY"])
        spec = m.group(1) if m else ""
    else:  # GOMP_CPU_AFFINITY "0 1", OMP_PLACES "{0,1}"
        spec = env.get("GOMP_CPU_AFFINITY") or env.get("OMP_PLACES", "")
    cpus = [int(c) for c in re.findall(r"\d+", spec)]
    return (int(env["OMP_NUM_THREADS"]), cpus) if cpus else None


def _bind_forked_worker() -> None:
    binding = omp_binding(os.environ)
    if binding is None:
        return
    import torch

    threads, cpus = binding
    os.sched_setaffinity(0, cpus)  # the OpenMP threads this process starts from now on inherit it
    torch.set_num_threads(threads)


class ForkedWorkerExecutor(MultiprocExecutor):
    """:class:`MultiprocExecutor` whose workers are forked rather than spawned, and bound as vLLM binds them."""

    def _init_executor(self) -> None:
        global FORKED_FROM
        # Read by vLLM's get_mp_context when it starts the workers; only this (engine-core) process is affected.
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        FORKED_FROM = os.getpid()
        # Runs only in children that return to Python (multiprocessing's forks), never in subprocess's.
        os.register_at_fork(after_in_child=_bind_forked_worker)
        super()._init_executor()


def executor_class(executor: str) -> type:
    """vLLM's executor for ``EngineConfig.executor`` where agentrl chooses it (``in_core`` anywhere, ``auto`` on CPU
    hosts). A class, not a name: vLLM CPU turns the name ``"uni"`` into ``"mp"``, a class it keeps."""
    if executor == "in_core":
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        return UniProcExecutor
    return ForkedWorkerExecutor


def start_llm(args: Any, *, fork_core: bool) -> Any:
    """vLLM's ``AsyncLLM`` for ``args`` (``AsyncEngineArgs``); with ``fork_core`` its engine-core process forked
    from this one (on CPU hosts, where vLLM would spawn it)."""
    global CORE_FORKED_FROM
    from vllm.utils.system_utils import set_env_var
    from vllm.v1.engine.async_llm import AsyncLLM

    config = args.create_engine_config()  # where vLLM CPU sets VLLM_WORKER_MULTIPROC_METHOD=spawn
    # Read by get_mp_context as the engine core starts, then restored: later configs set it again, and another
    # library's own processes need not follow ours.
    forking = set_env_var("VLLM_WORKER_MULTIPROC_METHOD", "fork") if fork_core else contextlib.nullcontext()
    CORE_FORKED_FROM = os.getpid() if fork_core else None
    try:
        with forking:
            return AsyncLLM.from_vllm_config(config, disable_log_stats=args.disable_log_stats)
    finally:
        CORE_FORKED_FROM = None
