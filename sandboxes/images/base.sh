#!/bin/sh
# Recipe for agentrl-base: Debian bookworm minbase with python3, git and procps, plus an unprivileged user
# `agent` (uid 1000). Usage: base.sh ROOTFS_DIR [MIRROR]. Needs root, debootstrap and a reachable Debian mirror.
set -eu
rootfs=$1
mirror=${2:-http://deb.debian.org/debian}
debootstrap --variant=minbase --include=python3,git,procps,ca-certificates bookworm "$rootfs" "$mirror"
# An unprivileged user for the sandboxed commands; HOME points at /tmp because the root is read-only.
grep -q '^agent:' "$rootfs/etc/passwd" || {
    echo 'agent:x:1000:1000:agentrl sandbox user:/tmp:/bin/sh' >>"$rootfs/etc/passwd"
    echo 'agent:x:1000:' >>"$rootfs/etc/group"
    echo 'agent:*:19000:0:99999:7:::' >>"$rootfs/etc/shadow"
}
mkdir -p "$rootfs/workspace"
chmod 1777 "$rootfs/workspace"
# Package caches and lists are dead weight in an image that never runs apt.
rm -rf "$rootfs/var/cache/apt/archives/"*.deb "$rootfs/var/lib/apt/lists/"* "$rootfs/usr/share/doc" \
    "$rootfs/usr/share/man" "$rootfs/usr/share/locale"
