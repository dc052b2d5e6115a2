"""Benchmark evaluation: a policy over a suite of envs, with resumable outputs and a report.

Modules: :mod:`.config` (what to run), :mod:`.instances` (what an env's instances are), :mod:`.policies` (who
plays), :mod:`.records` (what is written: JSON-lines files, records, report), :mod:`.run` (the run itself).

``run_eval(cfg)`` lists the instances of every env of the suite, skips those already recorded in the output
directory, runs the others with at most ``cfg.concurrency`` episodes alive at once, and writes into ``cfg.out``:

- ``trajectories.jsonl``: one record per finished instance (see :func:`episode_record`), the resume key being
  ``(env, instance_id)``;
- ``predictions.jsonl``: for envs whose final ``info`` carries a ``patch`` (SWE envs), one SWE-bench prediction per
  instance: ``{"instance_id", "model_name_or_path", "model_patch"}``; an episode of such an env (its class sets
  ``writes_predictions = True``) that errored gets an empty ``model_patch``, so every instance has one;
- ``report.json`` and ``report.md``: per env (and per ``info["category"]`` when envs report one) the number of
  instances, successes, accuracy (or resolved rate), mean reward, errors, tokens, time, and ``flagged``: episodes
  whose final ``info["integrity"]["flagged"]`` is set (SWE: read git history, or edited the tests that grade it).

Consistency (a crash or Ctrl-C at any moment leaves files a rerun can use):

- every line is written with one ``write`` on an ``O_APPEND`` descriptor and flushed (``fsync`` at the end), so a
  line is complete or absent; a torn last line (a kill during the write) is detected when the file is opened again
  and cut off;
- the trajectory line is written before its prediction line, in one step of the event loop, so an interrupt cannot
  fall between them; on resume, predictions without a trajectory are dropped and missing ones are rebuilt from the
  trajectory records (so ``predictions.jsonl`` never has duplicates);
- an interrupted episode writes nothing and is run again by the next run; the report is rewritten from the records
  on every exit (``"complete": false`` if instances are missing).

Instances: an env that has ``task_ids()`` (BFCL, SWE) is evaluated on every task, ``options={"index": i}`` and
``seed=i`` for the i-th; other envs (procedurally generated ones) on seeds ``seed .. seed+n-1`` with ``n`` the
limit (default :data:`DEFAULT_SEEDS`).
"""

from __future__ import annotations

# The public API, re-exported so that ``from agentrl.eval import ...`` does not depend on the module layout.
from agentrl.eval.config import (DEFAULT_SEEDS, PREDICTIONS, REPORT_JSON, REPORT_MD, SUITES, TRAJECTORIES, EnvEntry,
                                 EvalConfig, PolicyConfig, load_config)
from agentrl.eval.instances import Instance, episode_spec, list_instances, task_ids_of
from agentrl.eval.records import (JsonlLog, episode_record, prediction_of, render_markdown, success_of, summarize,
                                  write_report)
from agentrl.eval.policies import BuiltPolicy, build_policy, empty_policy_for, oracle_policy_for
from agentrl.eval.run import EvalResult, run_eval

__all__ = ["DEFAULT_SEEDS", "PREDICTIONS", "REPORT_JSON", "REPORT_MD", "SUITES", "TRAJECTORIES", "BuiltPolicy", "EnvEntry",
           "EvalConfig", "EvalResult", "Instance", "JsonlLog", "PolicyConfig", "build_policy", "empty_policy_for",
           "episode_record", "episode_spec", "list_instances", "load_config", "oracle_policy_for", "prediction_of",
           "render_markdown", "run_eval", "success_of", "summarize", "task_ids_of", "write_report"]
