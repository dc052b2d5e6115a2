"""Removal of leftover sandboxes: containers labelled ``agentrl.run`` and bwrap state dirs, tmpfs mounts, cgroups.

Without a run id, only orphans go: expired (past ``agentrl.expires``), exited, or created by a driver process on
this host that no longer exists. So a sweep is safe while other drivers run. With a run id (or ``everything``),
all of that run's (or every) sandbox goes.

Automatic sweeps (:func:`auto_sweep`): a pool sweeps the orphans of a backend the first time it is asked for a
sandbox of it, a sandbox that finds itself expired sweeps its backend, and sandbox creation sweeps at most every
``$AGENTRL_SWEEP_INTERVAL_S`` (300) seconds. So what a SIGKILLed driver left behind goes without anyone running
``agentrl sandboxes sweep``. They run in the sandbox thread pool and never raise (errors are logged).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .lifecycle import LABEL_DRIVER, LABEL_EXPIRES, LABEL_RUN, LABEL_SANDBOX, state_root, to_thread

log = logging.getLogger("agentrl.sandboxes")


@dataclass
class SweepReport:
    containers: list[str] = field(default_factory=list)  # "run/sandbox" of removed containers
    bwrap: list[str] = field(default_factory=list)  # "run/sandbox" of removed bwrap state
    errors: list[str] = field(default_factory=list)


def _driver_gone(tag: str) -> bool:
    host, _, pid = tag.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False  # another machine's driver: only its TTL tells
    try:
        os.kill(int(pid), 0)
        return False
    except ProcessLookupError:
        return True
    except PermissionError:
        return False


# A live driver starts its container right after creating it (a create's client timeout is 120 s): a container still
# "created" this long after was abandoned, by a create whose answer was lost or a start whose removal failed too.
CREATED_GRACE_S = 300.0


def _orphan(expires: str | None, driver: str | None, running: bool = True) -> bool:
    """Whether a sandbox is left over: ended, past its expiry, or its driver (on this host) is gone."""
    if not running:
        return True
    if expires and expires.isdigit() and int(expires) < time.time():
        return True
    return bool(driver) and _driver_gone(driver)


def sweep_docker(
    run: str | None = None, *, everything: bool = False, report: SweepReport | None = None
) -> SweepReport:
    import docker

    report = report or SweepReport()
    from .docker_engine import docker_client

    client = docker_client()
    label = f"{LABEL_RUN}={run}" if run else LABEL_RUN
    try:
        found = client.api.containers(all=True, filters={"label": label})
    except Exception as e:  # an engine down or overloaded: said, not raised, so the bwrap sweep still runs
        report.errors.append(f"docker engine: cannot list containers: {type(e).__name__}: {e}")
        return report
    for c in found:
        labels = c.get("Labels") or {}
        # "created": between a live driver's create and start calls, not an orphan unless its driver is gone or it
        # has waited past the grace
        abandoned = c.get("State") == "created" and time.time() - float(c.get("Created") or 0) > CREATED_GRACE_S
        if not (run or everything or abandoned) and not _orphan(
            labels.get(LABEL_EXPIRES), labels.get(LABEL_DRIVER), c.get("State") not in ("exited", "dead")
        ):
            continue
        try:
            client.api.remove_container(c["Id"], force=True)
            report.containers.append(f"{labels.get(LABEL_RUN)}/{labels.get(LABEL_SANDBOX)}")
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if getattr(e.response, "status_code", 0) != 409:  # 409: already being removed
                report.errors.append(f"{c['Id'][:12]}: {e}")
        except Exception as e:  # the engine timed out or went away: the next sweep retries this one
            report.errors.append(f"{c['Id'][:12]}: {type(e).__name__}: {e}")
    return report


def _read_meta(path: Path) -> dict[str, str]:
    try:
        return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    except OSError:
        return {}


def sweep_bwrap(
    run: str | None = None, *, everything: bool = False, report: SweepReport | None = None
) -> SweepReport:
    from .bwrap_state import release_state, safe_name
    from .cgroups import CGROUP_ROOT, V1_CONTROLLERS, Cgroup

    report = report or SweepReport()
    root = state_root()
    runs = [root / safe_name(run)] if run else (sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])
    for run_dir in runs:
        if not run_dir.is_dir():
            continue
        for sb_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
            meta = _read_meta(sb_dir / "meta")
            if not (run or everything) and not _orphan(meta.get("expires"), meta.get("driver")):
                continue
            for mode in ("v1", "v2"):
                cg = Cgroup(mode, run_dir.name, sb_dir.name)
                if any(d.exists() for d in cg.dirs):
                    try:
                        cg.remove()
                    except OSError as e:
                        report.errors.append(f"{run_dir.name}/{sb_dir.name} cgroup: {e}")
            try:
                release_state(sb_dir)  # unmounts its tmpfs mounts, then removes it
            except OSError as e:
                report.errors.append(f"{run_dir.name}/{sb_dir.name}: {e}")
                continue
            report.bwrap.append(f"{run_dir.name}/{sb_dir.name}")
        try:
            run_dir.rmdir()
        except OSError:
            pass
    # cgroup run dirs whose state is gone entirely (the state dir lives in /tmp, which may have been wiped)
    bases = [CGROUP_ROOT / "agentrl"] + [CGROUP_ROOT / c / "agentrl" for c in V1_CONTROLLERS]
    for base in bases:
        if not base.is_dir():
            continue
        for run_cg in base.iterdir():
            if not run_cg.is_dir() or (run and run_cg.name != safe_name(run)):
                continue
            for sb_cg in run_cg.iterdir():
                if sb_cg.is_dir() and not (root / run_cg.name / sb_cg.name).exists():
                    mode = "v2" if base == CGROUP_ROOT / "agentrl" else "v1"
                    try:
                        Cgroup(mode, run_cg.name, sb_cg.name).remove()
                        report.bwrap.append(f"{run_cg.name}/{sb_cg.name} (cgroup only)")
                    except OSError as e:
                        report.errors.append(f"{run_cg.name}/{sb_cg.name} cgroup: {e}")
            try:
                run_cg.rmdir()
            except OSError:
                pass
    return report


def sweep(
    run: str | None = None, *, everything: bool = False, docker: bool = True, bwrap: bool = True
) -> SweepReport:
    """Remove leftovers of both backends (see the module docstring for what counts). Returns what went."""
    report = SweepReport()
    if docker:
        from .docker_engine import docker_available

        ok, why = docker_available()
        if ok:
            sweep_docker(run, everything=everything, report=report)
        else:
            report.errors.append(f"docker: {why}")
    if bwrap:
        sweep_bwrap(run, everything=everything, report=report)
    return report


def merge(reports: list[SweepReport]) -> SweepReport:
    out = SweepReport()
    for r in reports:
        out.containers += r.containers
        out.bwrap += r.bwrap
        out.errors += r.errors
    return out


AUTO_SWEEP_INTERVAL_S = float(os.environ.get("AGENTRL_SWEEP_INTERVAL_S", "300"))
_auto_lock = threading.Lock()
_auto_last: dict[str, float] = {}
_auto_running: dict[str, "asyncio.Future[SweepReport]"] = {}


def _sweep_one(backend: str) -> SweepReport:
    try:
        if backend == "docker":
            return sweep_docker()
        return sweep_bwrap()
    except Exception as e:  # an automatic sweep must never break the caller
        log.warning("automatic sweep of %s sandboxes failed: %r", backend, e)
        return SweepReport(errors=[f"{backend}: {e!r}"])


def auto_sweep(backend: str, *, force: bool = False) -> "asyncio.Future[SweepReport] | None":
    """Schedule a sweep of ``backend``'s orphans (see the module docstring) on the running loop; returns its future,
    or None when one ran less than AUTO_SWEEP_INTERVAL_S ago (unless ``force``). One at a time per backend: a call
    while one runs returns that one."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    with _auto_lock:
        running = _auto_running.get(backend)
        if running is not None and not running.done() and running.get_loop() is loop:  # type: ignore[attr-defined]
            return running
        now = time.monotonic()
        if not force and now - _auto_last.get(backend, -1e18) < AUTO_SWEEP_INTERVAL_S:
            return None
        _auto_last[backend] = now
        fut = asyncio.ensure_future(to_thread(_sweep_one, backend))
        _auto_running[backend] = fut

    def done(f: "asyncio.Future[SweepReport]") -> None:
        if not f.cancelled() and f.exception() is None:
            r = f.result()
            if r.containers or r.bwrap:
                log.info("swept %d containers, %d bwrap sandboxes left by dead drivers or expired",
                         len(r.containers), len(r.bwrap))

    fut.add_done_callback(done)
    return fut
