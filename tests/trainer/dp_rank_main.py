"""One data-parallel trainer rank as a plain process (no Ray), for tests that need real ``torch.distributed``
ranks: ``python dp_rank_main.py RANK WORLD PORT MODEL_DIR WORK_DIR``. Reads ``WORK_DIR/job.pkl`` (``config``,
``steps``: a list of ``(trajectories, advantages)``, ``timeout_s``), joins the gloo group, takes each step on the
shard the trainer group's driver would send this rank (:func:`plan_shards`), gathers the weights, and rank 0 writes
``WORK_DIR/out.pt`` (``weights``, ``metrics``, ``shards``)."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from agentrl.trainer.dp_group import plan_shards
from agentrl.trainer.dp_rank import init_process_group
from agentrl.trainer.trainer import Trainer


def main(rank: int, world: int, port: int, model_dir: str, work: Path) -> None:
    job = pickle.loads((work / "job.pkl").read_bytes())
    cfg = job["config"]
    init_process_group("127.0.0.1", port, rank, world, "gloo", timeout_s=job["timeout_s"])
    tr = Trainer(cfg, model_dir)
    tr.enable_data_parallel()
    metrics, shards = [], []
    for trajs, advs in job["steps"]:
        plan = plan_shards(trajs, cfg, world, mini_batches=True)
        idx = plan[rank]
        shards.append(plan)
        metrics.append(tr.train_step([trajs[i] for i in idx], [advs[i] for i in idx], positions=idx))
    weights = tr.state_dict_for_inference(torch.float32)  # a collective under FSDP
    if rank == 0:
        torch.save({"weights": weights, "metrics": metrics, "shards": shards}, work / "out.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
