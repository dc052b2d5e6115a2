"""The forked CPU worker's OpenMP binding, read from the variables vLLM's ``OMPProcessManager`` sets for a worker
(the engine-level check, a real forked worker bound as vLLM binds a spawned one: ``test_engine.py``)."""

from __future__ import annotations

from agentrl.inference.vllm_executor import omp_binding


def test_the_binding_is_read_from_each_openmp_runtimes_variables():
    assert omp_binding({"OMP_NUM_THREADS": "2", "OMP_PLACES": "{3,5}", "OMP_PROC_BIND": "true"}) == (2, [3, 5])
    assert omp_binding({"OMP_NUM_THREADS": "2", "GOMP_CPU_AFFINITY": "4 6"}) == (2, [4, 6])
    assert omp_binding({"OMP_NUM_THREADS": "3", "KMP_AFFINITY": "granularity=fine,explicit,proclist=[0,1,2]",
                        "KMP_BLOCKTIME": "5"}) == (3, [0, 1, 2])


def test_no_binding_asked_leaves_the_worker_as_it_is():
    assert omp_binding({}) is None  # VLLM_CPU_OMP_THREADS_BIND=nobind: vLLM sets nothing
    assert omp_binding({"OMP_NUM_THREADS": "1"}) is None  # a thread count alone: no cores to bind to
    assert omp_binding({"OMP_NUM_THREADS": "1", "KMP_AFFINITY": "granularity=fine,compact"}) is None
