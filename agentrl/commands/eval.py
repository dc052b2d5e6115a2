"""``agentrl eval [CONFIG] [flags]`` and ``agentrl eval validate-swe``.

``agentrl eval configs/eval_bfcl_oracle.yaml`` runs an :class:`agentrl.eval.EvalConfig`; flags override the file,
or replace it: ``agentrl eval --env bfcl --policy oracle --limit 50 --out runs/bfcl``. ``--env`` is repeatable and
takes env ids or suite names (``bfcl``, ``bfcl-non-live``, ``bfcl-live``, ``bfcl-multi-turn``, ``tool-use``,
``swe``). ``--set key=value`` overrides any config key (``--set policy.rollout.temperature=0``; BFCL's answer
format: ``--set suite_kwargs.format=prompt``). BFCL runs also report the leaderboard's aggregated scores. Rerunning
the same command resumes: instances already recorded in ``--out`` are skipped. Exit status: 0 when every episode ran
(solved or not), 1 when some episodes errored (the summary line says how many; their SWE predictions are empty
patches), 130 on Ctrl-C (files consistent), 2 on a config error.

The SWE flags (``--instances``, ``--repos-dir``, ``--env-specs``, ``--cache-dir``, ``--ids``, ``--backend``,
``--image``) configure the SWE env of the run: ``agentrl eval --env swe --instances F --repos-dir D`` evaluates the
instances of ``F``. With no SWE env in the run they are an error; ``--episodes`` and ``--json`` belong to
``validate-swe`` only.

``agentrl eval validate-swe`` checks every instance of an SWE suite (gold patch resolves it, empty patch does not)
through the SWE env's own validator; it takes the same SWE flags.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval",
        help="evaluate a policy on env suites (BFCL, tool use, SWE); 'eval validate-swe' checks the SWE suite",
        description=(__doc__ or "").replace("``", "`"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", nargs="?", help="an eval YAML config, or 'validate-swe'")
    p.add_argument("--env", action="append", default=None, metavar="ID",
                   help="env id or suite name (repeatable); replaces the config's envs and suite")
    p.add_argument("--policy", choices=["oracle", "empty", "vllm", "remote", "openai-chat", "openai-responses",
                                        "anthropic-messages", "google-gemini"],
                   help="what acts (default: oracle); openai-chat / openai-responses / anthropic-messages / "
                        "google-gemini: a hosted API of that dialect at --endpoint")
    p.add_argument("--model", help="model directory (vllm: the weights; remote: the tokenizer; openai-chat: the "
                   "served model's name)")
    p.add_argument("--endpoint", help="remote: base URL of an OpenAI-compatible vLLM server; openai-chat: the API "
                   "root (.../v1)")
    p.add_argument("--name", help="model_name_or_path written into predictions.jsonl")
    p.add_argument("--limit", type=int, help="at most N instances per env")
    p.add_argument("--concurrency", type=int, help="episodes alive at once (default 8)")
    p.add_argument("--out", help="output directory (default eval_out)")
    p.add_argument("--seed", type=int, help="first seed of seed-indexed envs")
    p.add_argument("--retry-errors", action="store_true", help="rerun instances whose recorded episode errored")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    # validate-swe: the SWE validator's own options (agentrl.envs.swe.validate.build_parser), prefixed dests.
    v = p.add_argument_group("SWE options (the SWE env of a run, and validate-swe)")
    v.add_argument("--instances", dest="swe_instances", help="SWE-bench JSONL (default: the shipped suite)")
    v.add_argument("--repos-dir", dest="swe_repos_dir", help="directory of repositories (default: the suite's)")
    v.add_argument("--env-specs", dest="swe_env_specs", help="YAML/JSON env specs per repository and version")
    v.add_argument("--cache-dir", dest="swe_cache_dir", help="where repository exports are built")
    v.add_argument("--ids", dest="swe_ids", nargs="*", help="only these instance ids")
    v.add_argument("--backend", dest="swe_backend", choices=["docker", "bwrap", "auto"], help="sandbox backend")
    v.add_argument("--image", dest="swe_image", help="sandbox base image (Python 3.11 instances)")
    v.add_argument("--episodes", dest="swe_episodes", action="store_true",
                   help="validate-swe: also play oracle and empty episodes through the SWE env")
    v.add_argument("--json", dest="swe_json", help="validate-swe: write the per-instance results as JSON here")
    p.set_defaults(func=_main)


def _flags_to_overrides(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """Returns (``key=value`` overrides, direct values) for the flags that were given."""
    from agentrl.eval import SUITES

    direct: dict[str, Any] = {}
    if args.env:
        suites = [e for e in args.env if e in SUITES]
        ids = [e for e in args.env if e not in SUITES]
        if len(suites) > 1:
            # Several suites: expand them into explicit envs.
            ids = [i for s in suites for i in SUITES[s]] + ids
            suites = []
        direct["suite"] = suites[0] if suites else None
        direct["envs"] = [{"id": i} for i in ids]
    for flag, key in (("policy", "policy.kind"), ("model", "policy.model"), ("endpoint", "policy.endpoint"),
                      ("name", "policy.name"), ("limit", "limit"), ("concurrency", "concurrency"), ("out", "out"),
                      ("seed", "seed")):
        v = getattr(args, flag)
        if v is not None:
            direct[key] = v
    if args.retry_errors:
        direct["retry_errors"] = True
    if args.no_progress:
        direct["progress"] = False
    return list(args.set), direct


#: SWE flag -> SWEEnv keyword (``sandbox.*``: a SandboxSpec field).
SWE_FLAGS = {"instances": "instances", "repos_dir": "repos_dir", "env_specs": "env_specs", "cache_dir": "cache_dir",
             "ids": "instance_ids", "backend": "sandbox.backend", "image": "sandbox.image"}


def _apply_swe_flags(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """Puts the SWE flags given into the kwargs of the run's SWE env entries (the ``swe`` suite becomes an explicit
    entry). Raises ConfigError for SWE flags without an SWE env, and for validate-swe-only flags."""
    from agentrl.config import ConfigError
    from agentrl.eval import SUITES

    only_validate = [f for f, given in (("--episodes", args.swe_episodes), ("--json", args.swe_json)) if given]
    if only_validate:
        raise ConfigError(f"{', '.join(only_validate)}: only for `agentrl eval validate-swe` (a run writes "
                          "report.json and predictions.jsonl into --out)")
    given = {k: getattr(args, f"swe_{k}") for k in SWE_FLAGS if getattr(args, f"swe_{k}") is not None}
    if not given:
        return data
    swe_ids = set(SUITES["swe"])
    data = dict(data)
    envs = [dict(e) if isinstance(e, dict) else e for e in (data.get("envs") or [])]
    if data.get("suite") == "swe":
        data["suite"] = None
        envs = [{"id": i} for i in SUITES["swe"]] + envs
    targets = [e for e in envs if isinstance(e, dict) and e.get("id") in swe_ids]
    if not targets:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ConfigError(f"{flags}: these configure the SWE env, and this run has none (add --env swe)")
    for entry in targets:
        kwargs = dict(entry.get("kwargs") or {})
        for k, value in given.items():
            key = SWE_FLAGS[k]
            if key.startswith("sandbox."):
                sandbox = dict(kwargs.get("sandbox") or {})
                sandbox[key.split(".", 1)[1]] = value
                kwargs["sandbox"] = sandbox
            else:
                kwargs[key] = value
        entry["kwargs"] = kwargs
    data["envs"] = envs
    return data


def _apply(data: dict[str, Any], direct: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    for key, value in direct.items():
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node[part] = dict(node.get(part) or {})
            node = node[part]
        node[parts[-1]] = value
    return data


def _main(args: argparse.Namespace) -> int:
    if args.config == "validate-swe":
        return _validate_swe(args)
    from agentrl.config import apply_overrides, from_dict, read_yaml
    from agentrl.eval import EvalConfig, run_eval

    overrides, direct = _flags_to_overrides(args)
    source = "<command line>"
    data: dict[str, Any] = {}
    if args.config:
        source = args.config
        data = read_yaml(args.config)
    data = apply_overrides(_apply_swe_flags(args, _apply(data, direct)), overrides, source)
    cfg = from_dict(EvalConfig, data, source)
    result = run_eval(cfg)
    t = result.report["total"]
    flagged = f", {t['flagged']} flagged (read git history or edited tests)" if t.get("flagged") else ""
    print(f"{result.out}: {t['success']}/{t['n']} succeeded ({100 * t['accuracy']:.1f}%), "
          f"{result.ran} run now, {result.skipped} already done{flagged}; report in {result.out / 'report.md'}")
    for fmt, sec in (result.report.get("bfcl") or {}).items():
        from agentrl.envs.bfcl.scoring import SUMMARY

        tables = sec["leaderboard"]
        print(f"BFCL ({fmt}): " + ", ".join(f"{col} {tables[t].get(col)}" for t, col in SUMMARY))
    if result.stopped:
        print(f"{result.out}: stopped with {t['expected'] - t['n']} of {t['expected']} instance(s) not run: "
              f"{result.stopped}; the same command runs them (those recorded are kept); exit status 1",
              file=sys.stderr)
    if t["errors"]:
        print(f"{result.out}: {t['errors']} episode(s) ended in an error (counted as failures; SWE predictions are "
              f"empty patches); see the 'error' field in {result.out / 'trajectories.jsonl'}; --retry-errors "
              f"runs them again; exit status 1", file=sys.stderr)
    return 1 if result.stopped or t["errors"] else 0


def _validate_swe(args: argparse.Namespace) -> int:
    """Runs ``agentrl.envs.swe.validate`` with its defaults, overridden by the flags given here."""
    from agentrl.config import ConfigError

    try:
        from agentrl.envs.swe import validate as swe_validate
    except ImportError as e:
        raise ConfigError(f"validate-swe: the SWE env is not available in this checkout ({e})") from e
    vargs = swe_validate.build_parser().parse_args([])
    for name in ("instances", "repos_dir", "env_specs", "cache_dir", "ids", "backend", "image", "json"):
        value = getattr(args, f"swe_{name}")
        if value is not None:
            setattr(vargs, name, value)
    if args.swe_episodes:
        vargs.episodes = True
    if args.concurrency is not None:
        vargs.concurrency = args.concurrency
    ignored = [f for f in ("env", "policy", "model", "endpoint", "name", "limit", "out", "seed", "retry_errors")
               if getattr(args, f)]
    if ignored or args.set:
        flags = ", ".join("--" + f.replace("_", "-") for f in ignored + (["set"] if args.set else []))
        raise ConfigError(f"validate-swe does not take {flags} (it grades gold and empty patches; "
                          "to run a policy use `agentrl eval --env swe ...`)")
    return int(swe_validate.run(vargs))
