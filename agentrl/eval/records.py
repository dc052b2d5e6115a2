"""What a run writes: the append-only JSON-lines files (a line is complete or absent), the per-episode record and
SWE-bench prediction, and the report (per env and category) with its markdown rendering."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable

from agentrl.trajectory import Trajectory
from agentrl.eval.config import REPORT_JSON, REPORT_MD
from agentrl.eval.instances import Instance


class JsonlLog:
    """An append-only JSON-lines file whose lines are complete or absent.

    ``open()`` reads the existing records, cuts off a torn last line (no final newline, or not JSON) and returns
    the records (an unparseable line inside the file, which this class never writes, is skipped and counted). ``append(obj)`` writes ``json + "\\n"`` with a single ``os.write`` on an ``O_APPEND`` descriptor.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None
        self.dropped_partial = False  # open() cut off a torn last line
        self.bad_lines = 0  # unparseable lines inside the file, skipped

    def open(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        if self.path.exists():
            data = self.path.read_bytes()
            good = 0  # byte offset after the last complete, parseable line
            pos = 0
            while pos < len(data):
                nl = data.find(b"\n", pos)
                if nl < 0:
                    break  # no final newline: a torn last line
                line = data[pos:nl]
                obj = None
                if line.strip():
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError:
                        if nl + 1 >= len(data):
                            break  # the last line does not parse: torn
                        self.bad_lines += 1  # damage inside the file (not ours): skipped, kept
                if isinstance(obj, dict):
                    records.append(obj)
                pos = good = nl + 1
            if good < len(data):
                self.dropped_partial = True
                with self.path.open("r+b") as f:
                    f.truncate(good)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return records

    def append(self, obj: dict[str, Any]) -> None:
        if self._fd is None:
            raise RuntimeError(f"{self.path}: append() before open()")
        data = (json.dumps(obj, default=_json_default, ensure_ascii=False) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replaces the file's content atomically (temp file + rename) and reopens it for appending."""
        self.close()
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, default=_json_default, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None


def _json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


# ---------------------------------------------------------------------------------------------------------------
# Records


def success_of(reward: float, info: dict[str, Any]) -> bool:
    """Returns whether an episode counts as solved: ``info["resolved"]`` (SWE), else ``info["correct"]``, else
    ``reward >= 1``."""
    for key in ("resolved", "correct"):
        if isinstance(info.get(key), bool):
            return info[key]
    return reward >= 1.0


def episode_record(inst: Instance, traj: Trajectory) -> dict[str, Any]:
    """Returns the ``trajectories.jsonl`` record of a finished episode: the instance, ``success``, ``reward``,
    ``termination``, ``error``, ``num_turns``, token counts, seconds, the final ``info`` and the trajectory."""
    info = traj.info or {}
    return {
        "env": inst.env,
        "env_id": inst.env_id,
        "instance_id": inst.instance_id,
        "seed": inst.seed,
        "options": dict(inst.options),
        "success": bool(success_of(traj.reward, info)) and traj.termination != "error",
        "reward": float(traj.reward),
        "termination": traj.termination,
        "error": traj.error,
        "num_turns": traj.num_turns,
        "prompt_tokens": traj.prompt_len,
        "generated_tokens": int(sum(traj.loss_mask)),
        "total_tokens": len(traj.token_ids),
        # Seconds from the episode's start to its trajectory (queueing for a concurrency slot excluded).
        "time_s": max(0.0, float(traj.timings.get("total_s", 0.0)) - float(traj.timings.get("queue_s", 0.0))),
        "queue_s": float(traj.timings.get("queue_s", 0.0)),
        "category": info.get("category"),
        "predicts": inst.predicts,
        "info": info,
        "trajectory": traj.to_dict(),
    }


def prediction_of(record: dict[str, Any], model_name: str) -> dict[str, Any] | None:
    """Returns the SWE-bench prediction of a record whose final info has a ``patch`` (an empty patch for a record
    of a predicting env without one: an errored episode), else None."""
    info = record.get("info") or {}
    if "patch" not in info and not record.get("predicts"):
        return None
    patch = info.get("patch")
    return {
        "instance_id": info.get("instance_id") or record["instance_id"],
        "model_name_or_path": model_name,
        "model_patch": patch if isinstance(patch, str) else "",
    }


def summarize(records: list[dict[str, Any]], expected: dict[str, int], wall_s: float | None = None,
              policy: str = "") -> dict[str, Any]:
    """Returns the report: per env (``rows``, in ``expected``'s order) and per (env, category) when records carry a
    category, plus ``total``. Each row: ``n`` done, ``expected``, ``success``, ``accuracy`` (success/n),
    ``mean_reward``, ``errors``, ``flagged``, ``truncated``, ``prompt_tokens``/``generated_tokens`` (sums),
    ``mean_time_s``."""

    def row(name: str, rs: list[dict[str, Any]], exp: int | None) -> dict[str, Any]:
        n = len(rs)
        succ = sum(1 for r in rs if r.get("success"))
        return {
            "env": name,
            "n": n,
            "expected": exp,
            "success": succ,
            "accuracy": succ / n if n else 0.0,
            "mean_reward": sum(float(r.get("reward", 0.0)) for r in rs) / n if n else 0.0,
            "errors": sum(1 for r in rs if r.get("termination") == "error"),
            "flagged": sum(1 for r in rs if ((r.get("info") or {}).get("integrity") or {}).get("flagged")),
            "truncated": sum(1 for r in rs if r.get("termination") == "truncated"),
            "prompt_tokens": sum(int(r.get("prompt_tokens", 0)) for r in rs),
            "generated_tokens": sum(int(r.get("generated_tokens", 0)) for r in rs),
            "mean_time_s": sum(float(r.get("time_s", 0.0)) for r in rs) / n if n else 0.0,
        }

    by_env: dict[str, list[dict[str, Any]]] = {name: [] for name in expected}
    for r in records:
        by_env.setdefault(r["env"], []).append(r)
    rows, categories = [], []
    for name, rs in by_env.items():
        rows.append(row(name, rs, expected.get(name)))
        cats = sorted({str(r["category"]) for r in rs if r.get("category") is not None})
        if len(cats) > 1:
            for c in cats:
                categories.append(row(f"{name} [{c}]", [r for r in rs if str(r.get("category")) == c], None))
    total = row("total", records, sum(expected.values()))
    report = {
        "policy": policy,
        "complete": all(r["n"] >= (r["expected"] or 0) for r in rows),
        "wall_s": wall_s,
        "rows": rows,
        "categories": categories,
        "total": total,
    }
    if any(str(r.get("env_id", "")).startswith("agentrl/BFCL-") for r in records):
        # BFCL's per-category and leaderboard scores, aggregated by bfcl-eval's own code (agentrl.envs.bfcl.scoring).
        from agentrl.envs.bfcl.scoring import section

        report["bfcl"] = section(records, policy or "agentrl")
    return report


def render_markdown(report: dict[str, Any]) -> str:
    """Returns the report as a markdown table (one line per env, then categories, then the total)."""
    lines = [
        f"# Evaluation report ({report.get('policy') or 'policy'})",
        "",
        "| env | done | success | accuracy | mean reward | errors | truncated | prompt tokens | generated tokens | mean s/instance |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in [*report["rows"], *report["categories"], report["total"]]:
        done = f"{r['n']}/{r['expected']}" if r.get("expected") is not None else str(r["n"])
        name = f"**{r['env']}**" if r["env"] == "total" else r["env"]
        lines.append(
            f"| {name} | {done} | {r['success']} | {100 * r['accuracy']:.1f}% | {r['mean_reward']:.3f} | {r['errors']} "
            f"| {r['truncated']} | {r['prompt_tokens']} | {r['generated_tokens']} | {r['mean_time_s']:.3f} |"
        )
    lines.append("")
    if report.get("wall_s") is not None:
        lines.append(f"Wall time of the last run: {report['wall_s']:.1f} s.")
    if not report.get("complete"):
        lines.append("Incomplete: some instances have no record yet; rerun the same command to finish.")
    flagged = report["total"].get("flagged", 0)
    if flagged:
        per_env = ", ".join(f"{r['env']}: {r['flagged']}" for r in report["rows"] if r.get("flagged"))
        lines.append(f"Flagged episodes (read git history, or edited the tests or test hooks that grade them): "
                     f"{flagged} ({per_env}).")
    lines.append("Success = SWE `resolved`, else the env's `correct`, else reward >= 1; errored episodes count as failures.")
    if report.get("bfcl"):
        from agentrl.envs.bfcl.scoring import render_markdown as bfcl_markdown

        lines += ["", bfcl_markdown(report["bfcl"])]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict[str, Any]) -> None:
    """Writes ``report.json`` and ``report.md`` atomically (temp file + rename)."""
    for name, text in ((REPORT_JSON, json.dumps(report, indent=2) + "\n"), (REPORT_MD, render_markdown(report))):
        tmp = out / (name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
