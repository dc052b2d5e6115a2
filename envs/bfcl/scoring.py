"""BFCL scores of an ``agentrl eval`` run, aggregated by the leaderboard's own code.

From the run's records (one per episode; ``success`` is the official verdict, an errored episode counts as
wrong, as an inference error does in BFCL), per answer format:

1. per category: ``correct / total`` over the items run, i.e. what ``save_eval_results`` computes
   (``accuracy = correct_count / len(model_result)``);
2. the leaderboard table, by ``bfcl_eval.eval_checker.eval_runner_helper.generate_leaderboard_csv`` itself, fed
   the per-category scores as ``evaluate_task``/``record_result`` would (``{category: {"accuracy",
   "total_count"}}``): it builds the summary columns with ``calculate_unweighted_accuracy`` (non-live, multi-turn,
   the simple AST of Python/Java/JavaScript, irrelevance), ``calculate_weighted_accuracy`` (live) and
   ``calculate_percentage_weighted_accuracy`` (overall: non-live 10, live 10, irrelevance 10, multi-turn 30,
   agentic 40). Its CSVs (``data_overall.csv``, ``data_non_live.csv``, ``data_live.csv``, ``data_multi_turn.csv``)
   are read back into the report as the leaderboard prints them (percentages with two decimals).

Categories not run get the leaderboard's treatment: ``N/A`` in their column and 0 in every summary that holds them.
agentrl does not serve the agentic categories (web search, memory), so the official ``Overall Acc`` is at most
60 % here; the non-live, live and multi-turn summaries are complete when their categories were run in full.
"""

from __future__ import annotations

import contextlib
import csv
import io
import tempfile
from pathlib import Path
from typing import Any

from agentrl.envs.bfcl import categories
from agentrl.envs.bfcl.official import load

TABLES = {"overall": "data_overall.csv", "non_live": "data_non_live.csv", "live": "data_live.csv",
          "multi_turn": "data_multi_turn.csv"}
# The summary cells agentrl's markdown shows: (table, column). The section overall columns show N/A as soon as one
# of their categories is missing; the per-section tables' "Overall" columns count a missing category as 0.
SUMMARY = [("overall", "Overall Acc"), ("non_live", "Non-Live Overall Acc"), ("live", "Live Overall Acc"),
           ("multi_turn", "Multi Turn Overall Acc"), ("overall", "Relevance Detection"),
           ("overall", "Irrelevance Detection")]


def category_of(record: dict[str, Any]) -> str | None:
    """The BFCL category of an eval record (from its env id), or None for other envs."""
    return categories.ENV_IDS.get(str(record.get("env_id", "")))


def per_category(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{format: {category: {"correct", "total", "accuracy"}}}`` over the BFCL records."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        cat = category_of(r)
        if cat is None:
            continue
        fmt = str((r.get("info") or {}).get("format") or "qwen_fc")
        row = out.setdefault(fmt, {}).setdefault(cat, {"correct": 0, "total": 0})
        row["total"] += 1
        row["correct"] += bool(r.get("success"))
    for rows in out.values():
        for row in rows.values():
            row["accuracy"] = row["correct"] / row["total"]
    return out


def leaderboard_tables(scores: dict[str, dict[str, Any]], model: str, csv_dir: str | Path | None = None
                       ) -> dict[str, dict[str, str]]:
    """Runs ``generate_leaderboard_csv`` on one model's per-category ``scores`` and returns its rows
    ``{table: {column: value}}`` (values as in the CSVs: ``"85.50%"``, ``"N/A"``). The CSVs are written into
    ``csv_dir`` when given (else a temporary directory)."""
    helper = load().helper
    table = {model: {c: {"accuracy": s["accuracy"], "total_count": s["total"]} for c, s in scores.items()}}
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(csv_dir) if csv_dir is not None else Path(tmp)
        target.mkdir(parents=True, exist_ok=True)
        with contextlib.redirect_stdout(io.StringIO()):  # it prints a progress line
            helper.generate_leaderboard_csv(table, target)
        out = {}
        for name, file in TABLES.items():
            with (target / file).open(newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            out[name] = {k: v for k, v in rows[0].items() if k not in ("Rank", "Model", "Model Link")}
    return out


def section(records: list[dict[str, Any]], model: str = "agentrl", csv_dir: str | Path | None = None
            ) -> dict[str, Any] | None:
    """The report's ``bfcl`` section: per answer format, the per-category scores, the leaderboard tables
    (:func:`leaderboard_tables`) and whether every item of the categories run was run (``complete``). None when no
    record is a BFCL episode. ``csv_dir``: where to keep the official CSVs (one subdirectory per format)."""
    scores = per_category(records)
    if not scores:
        return None
    out: dict[str, Any] = {}
    for fmt, cats in scores.items():
        from agentrl.envs.bfcl.data import load_category

        complete = all(s["total"] >= len(load_category(c)) for c, s in cats.items())
        tables = leaderboard_tables(cats, f"{model} ({fmt})", None if csv_dir is None else Path(csv_dir) / fmt)
        out[fmt] = {
            "categories": {c: cats[c] for c in categories.ALL if c in cats},
            "missing_categories": [c for c in categories.ALL if c not in cats],
            "complete": complete,
            "leaderboard": tables,
        }
    return out


def render_markdown(sec: dict[str, Any]) -> str:
    """The ``bfcl`` section as markdown: per format, the per-category accuracies and the leaderboard summaries."""
    lines = []
    for fmt, s in sec.items():
        lines += [f"## BFCL ({fmt} format), aggregated by bfcl-eval's generate_leaderboard_csv", ""]
        lines += ["| category | correct | total | accuracy |", "| --- | ---: | ---: | ---: |"]
        for c, row in s["categories"].items():
            lines.append(f"| {c} | {row['correct']} | {row['total']} | {100 * row['accuracy']:.2f}% |")
        tables = s["leaderboard"]
        lines += ["", "| " + " | ".join(col for _, col in SUMMARY) + " |", "|" + " ---: |" * len(SUMMARY),
                  "| " + " | ".join(tables[t].get(col, "") for t, col in SUMMARY) + " |", ""]
        notes = []
        if not s["complete"]:
            notes.append("some categories were run on part of their items (scores over the items run)")
        if s["missing_categories"]:
            notes.append(f"not run (N/A, counted as 0 in the summaries that hold them): "
                         f"{', '.join(s['missing_categories'])}")
        notes.append("the agentic categories (web search, memory; 40 % of Overall Acc) are not served by agentrl")
        lines += [f"Note: {n}." for n in notes] + [""]
    return "\n".join(lines)
