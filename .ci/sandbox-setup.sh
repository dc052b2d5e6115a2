#!/usr/bin/env bash
# Sets up the sandbox engines on a fresh Debian machine (idempotent; run as root from the repository root):
# Debian's docker.io, bubblewrap, debootstrap, busybox-static, chromium (viewer tests); dockerd in the background
# (.ci/start-dockerd.sh, log in $DOCKERD_LOG); the images agentrl-base:latest and agentrl-busybox:latest (skipped
# when present).
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/agentrl-dockerd.log}

if [ "$(id -u)" -ne 0 ]; then
    echo "sandbox-setup: must run as root (installs packages, starts dockerd, builds images)" >&2
    exit 1
fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
command -v docker-init >/dev/null 2>&1 || need+=(tini)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
dpkg -s libseccomp2 >/dev/null 2>&1 || need+=(libseccomp2)
# Headless Chromium for the viewer's browser tests (tests/viewer/test_browser.py).
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ "${#need[@]}" -gt 0 ]; then
    echo "sandbox-setup: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

DOCKERD_LOG="$DOCKERD_LOG" bash .ci/start-dockerd.sh
echo "sandbox-setup: $(bwrap --version)"

# build-image skips an image whose docker tag and rootfs both exist.
.venv/bin/agentrl sandboxes build-image --all
