"""A driver process for the lifecycle tests: creates sandboxes, starts a long command in each, prints one
``READY {json}`` line, then waits to be killed (``wait``) or returns without stopping anything (``exit``).

usage: sandbox_driver.py RUN_ID TTL_S BACKEND[,BACKEND] wait|exit
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import signal
import sys

from agentrl.sandboxes import SandboxSpec, create_sandbox
from conftest import until_running  # (this script's directory is on sys.path)


async def main(run: str, ttl: float, backends: list[str], mode: str) -> None:
    boxes = []
    for backend in backends:
        for _ in range(2):
            sb = await create_sandbox(
                SandboxSpec(backend=backend, image="agentrl-busybox:latest", ttl_s=ttl), run=run
            ).start()
            boxes.append(sb)
    tasks = [asyncio.create_task(sb.exec("sleep 1000", timeout=900)) for sb in boxes]
    for sb in boxes:  # the commands are running (however long a loaded machine takes to start them)
        await until_running(sb, "sleep 1000")
    info = [{"backend": sb.backend, "id": sb.id, "container": getattr(sb, "container_id", None),
             "state_dir": str(getattr(sb, "state_dir", ""))} for sb in boxes]
    print("READY " + json.dumps(info), flush=True)
    if mode == "exit":
        for t in tasks:
            t.cancel()
        return
    await asyncio.sleep(3600)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # the test asks for the stacks of a driver that does not exit
    asyncio.run(main(sys.argv[1], float(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]))
