"""A plain-Python env (no gymnasium, no agentrl) for the out-of-process host's tests, run by the system Python.

Count-down: reset(seed) draws a start in 3..6 from ``random.seed(seed)`` (the process-global generator, as GEM and
TextArena do); the action "down" subtracts one, and reaching 0 ends the episode with reward 1. It prints to stdout on
every call (the host must keep that off the protocol). Faults: "raise" raises, "hang" sleeps, "crash" exits the
process with code 3 after writing to stderr, "nan" returns a NaN reward, "banner" raises an error decorated for a
terminal as nltk's are (a blank first line, rows of asterisks, a coloured name). "stop" ends the episode with both
flags set, as GEM's single-turn tasks do.
"""

import os
import random
import sys
import time


class CountDown:
    def __init__(self, start_bias: int = 0):
        self.bias, self.n = start_bias, 0

    def reset(self, seed=None, options=None):
        random.seed(seed)
        self.n = random.randint(3, 6) + self.bias
        print(f"chatty env: reset to {self.n}")  # must not corrupt the protocol
        os.write(1, b"and straight to fd 1\n")
        return f"Count down from {self.n}: say down.", {"start": self.n, "pid": os.getpid()}

    def step(self, action):
        print("chatty env: step", action)
        if action == "raise":
            raise ValueError("the env refused this action")
        if action == "hang":
            time.sleep(600)
        if action == "crash":
            sys.stderr.write("fixture env: crashing on purpose\n")
            sys.stderr.flush()
            os._exit(3)
        if action == "banner":
            raise LookupError("\n" + "*" * 70 + "\n  Resource \x1b[93mwords\x1b[0m not found.\n" + "*" * 70 + "\n")
        if action == "stop":
            return "stopped", 0.5, True, True, {}
        if action == "nan":
            return "nan", float("nan"), False, False, {}
        if action == "down":
            self.n -= 1
        done = self.n <= 0
        return f"now {self.n}", 1.0 if done else 0.0, done, False, {"n": self.n}

    def close(self):
        print("chatty env: closed")


def make(start_bias: int = 0):
    return CountDown(start_bias)
