#!/bin/sh
# The papers' settings on the simulator (configs/simulate/*.yaml): one table and one PNG per reproduction under
# ${OUT:-benchmarks/simulate}. Each run is seconds to minutes of CPU (the virtual clock; no GPU needed).
set -e
OUT=${OUT:-benchmarks/simulate}
A=${AGENTRL:-.venv/bin/agentrl}
mkdir -p "$OUT"
run() { name=$1; shift; echo "== $name: $*"; "$A" simulate "$@" --plot "$OUT/$name.png" | tee "$OUT/$name.md"; }
run rollflash_env_latency configs/simulate/rollflash_env_latency.yaml \
  --sweep run.env.kwargs.lockstep=true,false --sweep run.env.kwargs.turns=5,10 --baseline run.env.kwargs.lockstep=true
run rollflash_rlvr configs/simulate/rollflash_rlvr.yaml --sweep run.async_ratio=0,1,2 \
  --sweep hardware.trainer_gpus=0,8 --baseline run.async_ratio=0 --baseline hardware.trainer_gpus=0
run rollflash_agentic configs/simulate/rollflash_agentic.yaml --sweep run.async_ratio=0,1,2 \
  --sweep hardware.trainer_gpus=0,8 --baseline run.async_ratio=0 --baseline hardware.trainer_gpus=0
run rollpacker_tail configs/simulate/rollpacker_tail.yaml --sweep run.tail_batching.enabled=false,true \
  --sweep hardware.gpus=32,128 --baseline run.tail_batching.enabled=false
run rollflash_failslow configs/simulate/rollflash_failslow.yaml --sweep run.manager.extra_per_group=0,1,2 \
  --baseline run.manager.extra_per_group=0
run asyncflow_stream configs/simulate/asyncflow_stream.yaml run.steps=4 --sweep run.streaming=false,true \
  --sweep run.async_ratio=0,1 --baseline run.streaming=false --baseline run.async_ratio=0
# co-located (the engine waits while the trainer trains) at every GPU count
run scaling_gpus configs/simulate/rollflash_rlvr.yaml run.steps=4 --sweep hardware.gpus=16,32,64 \
  --sweep run.async_ratio=0,2 --baseline run.async_ratio=0
run group_size configs/simulate/rollflash_agentic.yaml run.steps=4 --sweep run.manager.group_size=4,8,16 \
  --sweep run.async_ratio=0,2 --baseline run.async_ratio=0
