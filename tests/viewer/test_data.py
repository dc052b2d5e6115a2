"""The viewer's data layer: byte-offset index of JSON-lines files, bad lines, growing files, filters, token text,
the trajectory view and the path checks."""

import json
import os
from pathlib import Path

import pytest

from agentrl.controller.runlog import TRAJECTORIES, summarize
from agentrl.trajectory import Trajectory
from agentrl.viewer.data import Filter, LogprobIndex, MetricsFile, TrajectoryIndex, UnsafePath, safe_file
from agentrl.viewer.render import diff_marks, trajectory_view
from agentrl.viewer.tokens import TokenDecoder, find_tokenizer


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_fast_summaries_equal_full_parses(run_dir, tmp_path):
    fast = TrajectoryIndex(run_dir / TRAJECTORIES)
    fast.refresh()
    # The same records with another key order: every line takes the full-parse path.
    slow_file = tmp_path / "slow.jsonl"
    slow_file.write_text("".join(json.dumps({"trajectory": r["trajectory"], "step": r["step"]}) + "\n"
                                 for r in records(run_dir / TRAJECTORIES)))
    slow = TrajectoryIndex(slow_file)
    slow.refresh()
    assert len(fast) == len(slow) == 24 and fast.problems.count == slow.problems.count == 0
    assert [fast.row(i) for i in range(24)] == [slow.row(i) for i in range(24)]
    r = fast.row(0)
    assert r["step"] == 1 and r["env"] == "agentrl/ToolUse-v0" and r["tokens"] > r["generated"] > 0


def test_bad_lines_are_counted_with_their_numbers_and_the_rest_is_served(run_copy):
    f = run_copy / TRAJECTORIES
    good = f.read_text().splitlines(keepends=True)
    f.write_text(good[0] + "{not json\n" + good[1] + "[1, 2]\n" + '{"hello": 1}\n' + "\n" + good[2]
                 + '{"step": 1, "summary": {"id": "torn"')
    idx = TrajectoryIndex(f)
    idx.refresh()
    assert len(idx) == 3
    assert [line for line, _ in idx.problems.lines] == [2, 4, 5]
    reasons = [r for _, r in idx.problems.lines]
    assert reasons[0].startswith("not JSON") and "not a JSON object" in reasons[1] and "no trajectory" in reasons[2]
    assert idx.problems.pending_tail  # a torn last line is pending, not counted as bad
    assert [idx.row(i)["line"] for i in range(3)] == [1, 3, 7]
    traj, meta = idx.record(2)
    assert traj["id"] == json.loads(good[2])["trajectory"]["id"] and meta["step"] == 1


def test_a_growing_file_is_indexed_incrementally_and_a_cut_one_from_scratch(run_copy):
    f = run_copy / TRAJECTORIES
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:5]) + lines[5][:40])
    idx = TrajectoryIndex(f)
    idx.refresh()
    assert len(idx) == 5 and idx.problems.pending_tail
    with open(f, "a") as fh:
        fh.write(lines[5][40:] + "".join(lines[6:10]))
    assert idx.refresh() and len(idx) == 10 and not idx.problems.pending_tail and idx.problems.count == 0
    assert idx.record(5)[0]["id"] == json.loads(lines[5])["trajectory"]["id"]
    assert not idx.refresh()
    tmp = f.with_suffix(".new")
    tmp.write_text("".join(lines[:3]))
    os.replace(tmp, f)  # a resumed run rewrote it shorter
    idx.refresh()
    assert len(idx) == 3 and [idx.row(i)["line"] for i in range(3)] == [1, 2, 3]


def test_filters_and_sorting(run_dir):
    idx = TrajectoryIndex(run_dir / TRAJECTORIES)
    idx.refresh()
    rows = [idx.row(i) for i in range(len(idx))]

    def ids(**q) -> list[str]:
        return [idx.ids[i] for i in idx.query(Filter.from_query({k: str(v) for k, v in q.items()}))]

    assert ids(step_min=2) == [r["id"] for r in rows if r["step"] >= 2]
    assert ids(env="agentrl/ToolUse-v0") == [r["id"] for r in rows if r["env"] == "agentrl/ToolUse-v0"]
    assert ids(reward_min=0.5) == [r["id"] for r in rows if r["reward"] >= 0.5]
    assert ids(length_min=200, length_max=600) == [r["id"] for r in rows if 200 <= r["tokens"] <= 600]
    assert ids(staleness_min=1) == [r["id"] for r in rows if r["staleness"] >= 1]
    assert ids(termination="truncated") == [r["id"] for r in rows if r["termination"] == "truncated"]
    assert ids(text="ToolUse-v0-s1") == [r["id"] for r in rows if "ToolUse-v0-s1" in r["id"]]
    by_len = ids(sort="tokens", desc="1")
    assert [idx.tokens[idx.by_id[i]] for i in by_len] == sorted((r["tokens"] for r in rows), reverse=True)
    with pytest.raises(ValueError, match="reward_min: expected a number"):
        Filter.from_query({"reward_min": "lots"})
    with pytest.raises(ValueError, match="sort: one of"):
        Filter.from_query({"sort": "__class__"})


def test_eval_and_rollout_formats(tmp_path, run_dir):
    t = records(run_dir / TRAJECTORIES)[0]["trajectory"]
    f = tmp_path / "mixed.jsonl"
    f.write_text(json.dumps({"env": "bfcl-simple", "instance_id": "simple_3", "success": True, "reward": 1.0,
                             "trajectory": t}) + "\n" + json.dumps(t) + "\n")
    idx = TrajectoryIndex(f)
    idx.refresh()
    assert len(idx) == 2 and idx.problems.count == 0
    assert idx.row(0)["env"] == "bfcl-simple" and idx.row(0)["success"] is True and idx.row(0)["step"] is None
    assert idx.row(1)["env"] == t["env_id"] and idx.row(1)["staleness"] is None


def test_metrics_and_logprob_files(tmp_path):
    m = tmp_path / "metrics.jsonl"
    m.write_text('{"step": 1, "reward": 0.5, "train/loss": 1.0}\nbroken\n{"step": 2, "reward": NaN, "x": "s"}\n'
                 '{"reward": 1}\n')
    mf = MetricsFile(m)
    mf.refresh()
    assert mf.columns(["reward", "train/loss", "nope"]) == {"step": [1.0, 2.0], "reward": [0.5, None],
                                                            "train/loss": [1.0, None]}
    assert [line for line, _ in mf.problems.lines] == [2, 4]
    lp = tmp_path / "lp.jsonl"
    lp.write_text('{"step": 1, "trajectory_id": "a\\"b", "version": 0, "logprobs": [-1.0, NaN]}\n'
                  '{"trajectory_id": "c", "logprobs": [-2.0], "version": 4}\n{"oops": 1}\n')
    li = LogprobIndex(lp)
    li.refresh()
    assert li.get('a"b') == {"version": 0, "step": 1, "logprobs": [-1.0, None]}
    assert li.get("c")["version"] == 4 and li.get("zzz") is None and li.problems.count == 1


def test_token_pieces_concatenate_to_the_decoded_text(run_dir):
    from transformers import AutoTokenizer

    path = find_tokenizer(run_dir)
    assert path is not None and path.parent.parent.parent.name == "checkpoints"
    dec = TokenDecoder.from_path(path)
    tok = AutoTokenizer.from_pretrained(str(path.parent))
    text = "<|im_start|>user\nHéllo wörld 日本語 🎉\t<tool_call>{\"a\": 1}</tool_call><|im_end|>\n"
    ids = tok.encode(text)
    pieces, unknown = dec.pieces(ids + [10**6])
    assert "".join(pieces[:-1]) == tok.decode(ids) == text and unknown == [len(ids)]
    assert pieces[-1] == "⟨1000000⟩"
    assert any(p == "" for p in pieces)  # a multi-byte character split over tokens shows on its last token


def test_view_blocks_follow_the_token_stream(run_dir):
    idx = TrajectoryIndex(run_dir / TRAJECTORIES)
    idx.refresh()
    lp = LogprobIndex(run_dir / "trainer_logprobs.jsonl")
    lp.refresh()
    dec = TokenDecoder.from_path(find_tokenizer(run_dir))
    row = next(i for i in range(len(idx)) if idx.envs[idx.env_codes[i]] == "agentrl/ToolUse-v0")
    traj, meta = idx.record(row)
    v = trajectory_view(traj, meta, dec, lp.get(traj["id"]), idx.row(row))
    T = v["tokens"]
    assert T["n"] == len(traj["token_ids"]) and "".join(T["text"]).startswith("<|im_start|>system")
    asst = [b for b in v["blocks"] if b["kind"] == "assistant"]
    assert len(asst) == traj["num_turns"] and [b["reward"] for b in asst] == traj["rewards"]
    for b in asst:
        assert all(T["mask"][i] == 1 for i in range(b["start"], b["end"]))
    assert any(b["kind"] == "tool" for b in v["blocks"]) and any(b["tool_calls"] for b in asst)
    for s, e in T["tool"]:
        assert "<tool_call>" in "".join(T["text"][s:e])
    # Blocks tile the token stream in order.
    spans = [(b["start"], b["end"]) for b in v["blocks"] if b["end"] > b["start"]]
    assert spans[0][0] == 0 and spans[-1][1] == T["n"] and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    # The trainer's log-prob of token i is record[i - 1].
    rec = lp.get(traj["id"])
    if rec is not None:
        assert T["tlp"][0] is None and len(T["tlp"]) == T["n"]
        assert all(abs(a - b) <= 5e-6 for a, b in zip(T["tlp"][1:], rec["logprobs"], strict=True))


def test_view_of_a_misaligned_or_text_only_record_warns_and_still_renders():
    t = Trajectory(id="x", group_id="g", env_id="e", messages=[{"role": "user", "content": "q"},
                   {"role": "assistant", "content": "<tool_call>{\"name\": \"f\"}</tool_call>"}], rewards=[0.5]).to_dict()
    v = trajectory_view(t, {}, None)
    assert [b["kind"] for b in v["blocks"]] == ["user", "assistant"] and v["blocks"][1]["tool_calls"] == ["f"]
    bad = dict(t, token_ids=[1, 2, 3], loss_mask=[0, 1], logprobs=[0.0, float("nan")], versions=[-1, 0, 0])
    v = trajectory_view(bad, {}, None)
    assert v["tokens"]["n"] == 2 and "different lengths" in v["warnings"][0]
    assert v["tokens"]["lp"] == [None, None]  # NaN is not JSON


def test_diff_marks_the_first_divergence():
    a = diff_marks([1, 2, 3, 4, 5], [0, 0, 1, 1, 0], [1, 2, 3, 9, 5], [0, 0, 1, 1, 0])
    assert a["first_diff"] == 3 and a["same_a"] == [1, 1, 1, 0, 1] and a["same_b"] == [1, 1, 1, 0, 1]
    assert diff_marks([1, 2], [0, 1], [1, 2], [0, 1])["first_diff"] is None


def test_paths_outside_the_directory_are_refused(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"token_ids": [1]}\n')
    (root / "trajectories.jsonl").symlink_to(secret)
    (root / "inside.jsonl").write_text("{}\n")
    (root / "alias.jsonl").symlink_to(root / "inside.jsonl")
    with pytest.raises(UnsafePath, match="outside the served directory"):
        safe_file(root, "trajectories.jsonl")
    assert safe_file(root, "alias.jsonl") == (root / "inside.jsonl").resolve()
    assert safe_file(root, "missing.jsonl") is None
    for name in ("../secret.jsonl", "..", "a/b", ""):
        with pytest.raises(UnsafePath):
            safe_file(root, name)


def test_summarize_matches_index_staleness_definition():
    t = Trajectory(id="a", group_id="g", env_id="e", token_ids=[1, 2, 3], loss_mask=[0, 1, 1],
                   logprobs=[0.0, -1.0, -1.0], versions=[-1, 4, 6]).to_dict()
    assert summarize(t, 8)["staleness"] == 8 - 1 - 4
