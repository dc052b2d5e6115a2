"""agentrl: reinforcement learning for LLM agents on multi-turn, sandboxed, gymnasium-style environments."""

__version__ = "0.1.0"

from agentrl.core import (Env, Message, MessagesSpace, Observation, OrderEnforcing, TextSpace, TimeLimit, Wrapper,
                          as_messages)
from agentrl.registration import RegistrationError, make, register, registered_ids, spec
from agentrl.trajectory import Group, Trajectory

import agentrl.envs  # noqa: E402,F401  registers the built-in envs (agentrl/ namespace)
from agentrl.registration import load_plugins as _load_plugins  # noqa: E402

_load_plugins()

from agentrl._moved import install as _install_moved  # noqa: E402

_install_moved()

__all__ = [
    "Env", "Message", "MessagesSpace", "Observation", "OrderEnforcing", "TextSpace", "TimeLimit", "Wrapper",
    "as_messages", "RegistrationError", "make", "register", "registered_ids", "spec", "Group", "Trajectory", "__version__",
]
