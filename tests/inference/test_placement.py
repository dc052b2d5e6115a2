"""Where engine replicas go on a Ray cluster: the resource check (clear errors naming the config field and what
Ray has, before any model loads), placement by node labels and custom resources on a real two-node Ray cluster
started on this machine, and the replica config's validation. No vLLM engine starts here."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.inference.config import EngineConfig
from agentrl.inference.placement import Ask, ResourceError, check_fits, engine_ask

ROOT = Path(__file__).resolve().parents[2]


def _node(node_id, resources, labels=None):
    return {"NodeID": node_id, "Alive": True, "Resources": resources, "Labels": labels or {}}


def test_too_many_cpu_replicas_named_with_what_ray_has():
    trainer = Ask("trainer_num_cpus / trainer.device", 1, {"CPU": 1.0})
    ok = engine_ask(EngineConfig(replicas=2), gpus=False)
    check_fits([trainer, ok], available={"CPU": 2.0}, nodes=[_node("n1", {"CPU": 2.0})])
    with pytest.raises(ResourceError) as e:
        check_fits([trainer, engine_ask(EngineConfig(replicas=3), gpus=False)], available={"CPU": 2.0},
                   nodes=[_node("n1", {"CPU": 2.0})])
    msg = str(e.value)
    assert "engine.replicas=3" in msg and "CPU 0.5" in msg and "CPU 2 free" in msg and "ray_num_cpus" in msg


def test_more_gpu_replicas_than_gpus():
    nodes = [_node("n1", {"CPU": 32.0, "GPU": 2.0})]
    with pytest.raises(ResourceError, match=r"engine.replicas=3 asks 3 x \{CPU 0.5, GPU 1\}.*GPU 2 free"):
        check_fits([engine_ask(EngineConfig(replicas=3), gpus=True)], available={"CPU": 32.0, "GPU": 2.0}, nodes=nodes)
    # Enough GPUs in total but no node holds one tensor-parallel replica.
    two_nodes = [_node("n1", {"CPU": 8.0, "GPU": 2.0}), _node("n2", {"CPU": 8.0, "GPU": 2.0})]
    ask = engine_ask(EngineConfig(replicas=1, tensor_parallel_size=4, weight_sync="nccl"), gpus=True)
    with pytest.raises(ResourceError, match="tensor_parallel_size=4: no node can hold one unit"):
        check_fits([ask], available={"CPU": 16.0, "GPU": 4.0}, nodes=two_nodes)


def test_label_no_node_has():
    nodes = [_node("n1", {"CPU": 4.0}, {"agentrl/role": "trainer"})]
    ask = engine_ask(EngineConfig(replicas=2, label_selector={"agentrl/role": "inference"}), gpus=False)
    with pytest.raises(ResourceError, match=r"with labels \{'agentrl/role': 'inference'\}.*'agentrl/role': 'trainer'"):
        check_fits([ask], available={"CPU": 4.0}, nodes=nodes)


def test_in_driver_engine_asks_nothing():
    assert engine_ask(EngineConfig(replicas=1)) is None


def test_replica_config_errors_name_the_field():
    with pytest.raises(ValueError, match="replicas"):
        EngineConfig(replicas=0).validate()
    with pytest.raises(ValueError, match="replicas: the remote backend"):
        EngineConfig(backend="remote", urls=["http://x:1"], replicas=2).validate()
    with pytest.raises(ValueError, match="weight_sync: 'nccl' is not for backend 'remote'"):
        EngineConfig(backend="remote", urls=["http://x:1"], weight_sync="nccl").validate()
    with pytest.raises(ValueError, match="weight_sync: 'http' is not for backend 'vllm'"):
        EngineConfig(weight_sync="http").validate()
    with pytest.raises(ValueError, match="resources.GPU"):
        EngineConfig(resources={"GPU": 1}).validate()
    assert EngineConfig(weight_sync="gloo").uses_replica_actors()  # the trainer reaches engines through Ray
    assert not EngineConfig().uses_replica_actors()


@pytest.fixture(scope="module")
def two_node_cluster():
    """A real Ray cluster of two nodes on this machine: a head with 1 CPU (the "trainer node") and a node with
    2 CPUs, the label agentrl/role=inference and the custom resource inference_slot=2."""
    import ray
    from ray._common.utils import get_ray_address_file
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    address_file = Path(get_ray_address_file(None))
    before = address_file.read_text() if address_file.exists() else None
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    # Cluster advertises itself in /tmp/ray/ray_current_cluster, where any plain ray.init() on this machine (other
    # tests, other users) would join it: take that back at once.
    if before is None:
        address_file.unlink(missing_ok=True)
    else:
        address_file.write_text(before)
    node = cluster.add_node(num_cpus=2, resources={"inference_slot": 2}, labels={"agentrl/role": "inference"})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        yield node.node_id
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_replicas_placed_by_label_and_resource(two_node_cluster):
    """The real replica actors (no engine started) land on the labelled node, split its cores, and a label or
    resource the cluster lacks is refused before anything starts."""
    import ray
    from ray.util.placement_group import remove_placement_group

    from agentrl.inference.placement import reserve
    from agentrl.inference.replicas import place_replicas, thread_binding

    inference_node = two_node_cluster
    cfg = EngineConfig(replicas=2, num_cpus=1, resources={"inference_slot": 1},
                       label_selector={"agentrl/role": "inference"}, placement_strategy="STRICT_PACK")
    check_fits([engine_ask(cfg, gpus=False)])
    pg = reserve(cfg, gpus=False, timeout_s=120)
    actors = place_replicas(cfg, pg, gpus=False)
    try:
        infos = ray.get([a.node_info.remote() for a in actors], timeout=120)
        assert [i["node_id"] for i in infos] == [inference_node] * 2
        binds = [e["VLLM_CPU_OMP_THREADS_BIND"] for e in thread_binding(infos, gpus=False)]
        assert all(binds) and set(binds[0].split(",")).isdisjoint(binds[1].split(","))  # each its own cores
        # The labelled node's custom resource is now taken: a third replica cannot be placed.
        with pytest.raises(ResourceError, match="inference_slot"):
            check_fits([engine_ask(EngineConfig(replicas=2, resources={"inference_slot": 1}), gpus=False)])
    finally:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)
    with pytest.raises(ResourceError, match="no node with labels"):
        check_fits([engine_ask(EngineConfig(replicas=2, label_selector={"agentrl/role": "gpu-box"}), gpus=False)])
    # A placement Ray cannot satisfy in time is removed and reported (here: STRICT_SPREAD over one matching node).
    bad = EngineConfig(replicas=2, label_selector={"agentrl/role": "inference"}, placement_strategy="STRICT_SPREAD")
    with pytest.raises(ResourceError, match="did not place 2 x"):
        reserve(bad, gpus=False, timeout_s=5)


def test_train_refuses_too_many_replicas_before_loading_a_model(two_node_cluster, tmp_path):
    """``agentrl train configs/quickstart.yaml engine.replicas=5`` on a cluster of 3 CPUs: a config error naming
    the field and what Ray has, raised before the warm start (the first model load) and before any engine."""
    import asyncio

    from agentrl.cli import main
    from agentrl.controller.run import load_config, train

    run_dir = tmp_path / "run"
    cfg = load_config(ROOT / "configs/quickstart.yaml", ["engine.replicas=5", f"run_dir={run_dir}", "progress=false"])
    with pytest.raises(ResourceError) as e:
        asyncio.run(train(cfg))
    msg = str(e.value)
    assert "engine.replicas=5 asks 5 x {CPU 0.5}" in msg and "trainer_num_cpus" in msg and "CPU 3 free" in msg
    assert not (run_dir / "warmstart").exists()
    # The command line turns it into a one-line config error (exit code 2), not a traceback.
    assert main(["train", str(ROOT / "configs/quickstart.yaml"), "engine.replicas=5",
                 f"run_dir={tmp_path / 'run2'}", "progress=false"]) == 2
