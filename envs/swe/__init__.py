"""SWE-bench-style tasks: instances, an offline suite, a sandboxed env and a grader.

Public API::

    from agentrl.envs.swe import (
        SWEInstance, load_instances, InstanceError,        # instances.py
        RepoStore, SUITE_INSTANCES, build_git_repo,         # repos.py
        grade, GradeResult,                                 # grader.py
        SWEEnv, SWEEnvConfig, oracle_policy_fn, empty_policy_fn,   # env.py (registered as agentrl/SWE-v0)
        run_episode, validate_instances,                    # validate.py
    )

``python -m agentrl.envs.swe.validate`` checks that every instance of a suite is resolved by its gold patch and
not by the empty patch.
"""

from .env import SWEEnv, SWEEnvConfig, empty_policy_fn, oracle_policy_fn
from .grader import GradeResult, grade
from .instances import InstanceError, SWEInstance, load_instances, parse_instance
from .repos import SUITE_INSTANCES, SUITE_REPOS, RepoError, RepoStore, build_git_repo
from .validate import run_episode, validate_instances

__all__ = [
    "SWEEnv", "SWEEnvConfig", "empty_policy_fn", "oracle_policy_fn",
    "GradeResult", "grade",
    "InstanceError", "SWEInstance", "load_instances", "parse_instance",
    "SUITE_INSTANCES", "SUITE_REPOS", "RepoError", "RepoStore", "build_git_repo",
    "run_episode", "validate_instances",
]
