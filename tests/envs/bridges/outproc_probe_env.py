"""A plain-Python env (no agentrl) whose actions are what model-written code could do in its process: each step
runs one probe and answers what happened. For the out-of-process host's sandbox test.

Actions: ``read PATH``, ``write PATH``, ``connect PORT`` (127.0.0.1), ``init`` (the command line of PID 1).
"""

import os
import socket


class Probe:
    def reset(self, seed=None, options=None):
        return "probe ready", {}

    def step(self, action):
        verb, _, arg = action.partition(" ")
        try:
            if verb == "read":
                with open(arg) as f:
                    out = "read: " + f.read(100)
            elif verb == "write":
                with open(arg, "w") as f:
                    f.write("x")
                out = "written"
            elif verb == "connect":
                with socket.create_connection(("127.0.0.1", int(arg)), timeout=3):
                    out = "connected"
            elif verb == "init":
                with open("/proc/1/cmdline", "rb") as f:
                    out = "init: " + f.read().replace(b"\0", b" ").decode()
            else:
                out = f"unknown action {action!r}"
        except Exception as e:
            out = f"refused: {type(e).__name__}: {e}"
        return out, 0.0, False, False, {"uid": os.getuid()}


def make():
    return Probe()
