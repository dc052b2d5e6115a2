"""SWE-bench-style tasks on real repositories: instances, per-instance images, a sandboxed env and a hardened grader.

Public API::

    from agentrl.envs.swe import (
        SWEInstance, load_instances, InstanceError,            # instances.py: SWE-bench JSONL
        RepoStore, SUITE_INSTANCES, build_git_repo,             # repos.py: single-commit exports, no later history
        EnvSpec, EnvSpecs, EnvSpecError,                        # envspec.py: python, pip, install, runner per repo/version
        ImageBuilder, ImageError,                               # images.py: cached per-instance images (docker/bwrap)
        grade, GradeResult,                                     # grader.py
        SWEEnv, SWEEnvConfig, oracle_policy_fn, empty_policy_fn,   # env.py (registered as agentrl/SWE-v0)
        run_episode, validate_instances,                        # validate.py
    )

``python -m agentrl.envs.swe.validate`` checks that every instance of a suite is resolved by its gold patch and
not by the empty patch; ``python -m agentrl.envs.swe.cheats`` plays the reward hacks the env must withstand;
``python -m agentrl.envs.swe.upstream OUT`` builds the real upstream instances from PyPI sdists;
``python -m agentrl.envs.swe.authoring`` makes an instance from two commits of a repository.
"""

from .env import GoldPatchError, SWEEnv, SWEEnvConfig, empty_policy_fn, oracle_policy_fn
from .envspec import EnvSpec, EnvSpecError, EnvSpecs
from .grader import GradeResult, grade
from .images import ImageBuilder, ImageError
from .instances import InstanceError, SWEInstance, load_instances, parse_instance
from .repos import SUITE_INSTANCES, SUITE_REPOS, RepoError, RepoStore, build_git_repo


def __getattr__(name: str):
    # validate.py runs as `python -m agentrl.envs.swe.validate`: importing it here eagerly would make runpy warn
    if name in ("run_episode", "validate_instances"):
        from . import validate

        return getattr(validate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SWEEnv", "SWEEnvConfig", "GoldPatchError", "empty_policy_fn", "oracle_policy_fn",
    "EnvSpec", "EnvSpecError", "EnvSpecs", "ImageBuilder", "ImageError",
    "GradeResult", "grade",
    "InstanceError", "SWEInstance", "load_instances", "parse_instance",
    "SUITE_INSTANCES", "SUITE_REPOS", "RepoError", "RepoStore", "build_git_repo",
    "run_episode", "validate_instances",
]
