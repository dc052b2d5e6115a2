#!/usr/bin/env bash
# Starts dockerd in the background (log in $DOCKERD_LOG) unless a daemon answers already, and waits until it answers.
# dockerd gives up on its own containerd after a fixed 15 s ("failed to start containerd: timeout waiting for
# containerd to start") and exits; on a loaded machine that happens (CI, stop 41), so a daemon that exits before it
# answers is started again, up to $DOCKERD_STARTS starts within $DOCKERD_WAIT_S seconds. The next start reuses the
# containerd the last one left starting (dockerd finds it by its pid file).
set -euo pipefail
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/agentrl-dockerd.log}
DOCKERD_WAIT_S=${DOCKERD_WAIT_S:-180}
DOCKERD_STARTS=${DOCKERD_STARTS:-4}

ready() { echo "sandbox-setup: docker $(docker version --format '{{.Server.Version}}') ready"; }
docker info >/dev/null 2>&1 && { ready; exit 0; }
mkdir -p "$(dirname "$DOCKERD_LOG")"
starts=0
pid=""
start() {
    # dockerd trusts containerd's pid file: once that pid belongs to another process (pid reuse after a crash), every
    # start waits 15 s for a containerd that is not there and exits. Seen here on 2026-11-28.
    local cpid=/var/run/docker/containerd/containerd.pid
    if [ -f "$cpid" ] && ! grep -qsx containerd "/proc/$(cat "$cpid" 2>/dev/null)/comm"; then rm -f "$cpid"; fi
    starts=$((starts + 1))
    echo "sandbox-setup: starting dockerd (start $starts of at most $DOCKERD_STARTS; log: $DOCKERD_LOG)"
    nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    pid=$!
}
if pgrep -x dockerd >/dev/null 2>&1; then
    echo "sandbox-setup: dockerd is running but not answering yet; waiting"
else
    start
fi
deadline=$(( $(date +%s) + DOCKERD_WAIT_S ))
until docker info >/dev/null 2>&1; do
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
        if [ "$starts" -ge "$DOCKERD_STARTS" ]; then
            echo "sandbox-setup: dockerd exited $starts times before it answered; last lines of $DOCKERD_LOG:" >&2
            tail -n 30 "$DOCKERD_LOG" >&2 || true
            exit 1
        fi
        echo "sandbox-setup: dockerd exited before it answered: $(tail -n 1 "$DOCKERD_LOG" 2>/dev/null)"
        start
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "sandbox-setup: dockerd did not answer within ${DOCKERD_WAIT_S}s; last lines of $DOCKERD_LOG:" >&2
        tail -n 30 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
    sleep 1
done
ready
