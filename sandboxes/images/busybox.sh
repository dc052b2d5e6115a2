#!/bin/sh
# Recipe for agentrl-busybox: a static busybox with its applets as symlinks and an unprivileged user `agent`
# (uid 1000). Usage: busybox.sh ROOTFS_DIR. Needs a static busybox (Debian's busybox-static) on the host.
set -eu
rootfs=$1
bb=${BUSYBOX:-/bin/busybox}
if ! LC_ALL=C ldd "$bb" 2>&1 | grep -q 'not a dynamic executable'; then
    echo "busybox.sh: $bb is not a static binary (install busybox-static)" >&2
    exit 1
fi
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp" "$rootfs/workspace" "$rootfs/proc" "$rootfs/dev" "$rootfs/sys"
cp "$bb" "$rootfs/bin/busybox"
for applet in $("$rootfs/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
done
ln -sfn bin "$rootfs/sbin"
mkdir -p "$rootfs/usr"
ln -sfn ../bin "$rootfs/usr/bin"
printf 'root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agentrl sandbox user:/tmp:/bin/sh\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nagent:x:1000:\n' >"$rootfs/etc/group"
chmod 1777 "$rootfs/tmp" "$rootfs/workspace"
