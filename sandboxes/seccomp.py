"""The seccomp filter of bwrap sandboxes, compiled to a classic BPF program by libseccomp (through ``pyseccomp``, a
ctypes binding of the system's libseccomp.so.2) and handed to ``bwrap --seccomp FD``.

Policy (close to Docker's default profile, for a sandbox that has no capabilities anyway): every syscall is allowed
except those that reach kernel surface a build-and-test sandbox never needs: namespaces and mounts (``unshare``,
``setns``, ``mount`` and the new mount API, ``pivot_root``, ``clone`` with a ``CLONE_NEW*`` flag), kernel modules,
kexec, reboot, swap, clock setting, keyrings, BPF, perf events, userfaultfd, io_uring, ptrace and cross-process
memory access, handle-based opens, quotas, NUMA memory policy, ``acct``, ``syslog``. Denied calls fail with EPERM; ``clone3`` fails with ENOSYS, so the C library falls back to ``clone``, whose
flags a filter can inspect. A syscall of another ABI (32-bit x86 via int 0x80, x32) kills the process: libseccomp
checks the architecture first.
"""

from __future__ import annotations

import errno
import logging
import os
import threading

log = logging.getLogger("agentrl.sandboxes")

DENIED = (
    # namespaces, mounts, root changes
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    # kernel, time, machine
    "init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "stime", "acct", "syslog", "vhangup", "iopl", "ioperm", "quotactl", "quotactl_fd",
    "nfsservctl", "sysfs", "_sysctl", "ustat", "uselib", "lookup_dcookie", "vm86", "vm86old",
    # keyrings, BPF, perf, fanotify, userfaultfd, io_uring
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "fanotify_init", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # other processes' memory and handles
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "name_to_handle_at",
    "open_by_handle_at",
    # NUMA policy
    "mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
)
NEW_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)

_lock = threading.Lock()
_program: bytes | None = None
_failure: str | None = None


def _build() -> bytes:
    import tempfile

    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    for name in DENIED:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        except (ValueError, OSError):  # not a syscall on this architecture
            continue
    try:
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    except (ValueError, OSError):
        pass
    for flag in NEW_NAMESPACE_FLAGS:  # clone's first argument is its flags on x86_64 and aarch64
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def program() -> bytes | None:
    """The compiled filter (struct sock_filter array), built once per process; None when libseccomp is missing
    (a warning says so once, and bwrap sandboxes then run without a filter)."""
    global _program, _failure
    with _lock:
        if _program is None and _failure is None:
            try:
                _program = _build()
            except Exception as e:  # no libseccomp.so.2, or no pyseccomp
                _failure = f"{type(e).__name__}: {e}"
                log.warning("bwrap sandboxes run without a seccomp filter: %s (install libseccomp2 and pyseccomp)",
                            _failure)
        return _program


def memfd(data: bytes, name: str) -> int:
    """An in-memory file holding ``data``, positioned at 0 (for bwrap's fd arguments). The caller closes it."""
    fd = os.memfd_create(name)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
