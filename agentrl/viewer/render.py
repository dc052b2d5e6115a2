"""One trajectory (or two, diffed) as the JSON the page draws: token arrays plus chat blocks over them.

Blocks follow the token stream. Runs of ``loss_mask == 1`` are the assistant's turns (turn ``k`` gets the env's
step reward ``rewards[k]``); the ``loss_mask == 0`` run before the first turn holds the opening messages, the run
after turn ``k`` the assistant's closing tokens and the env's messages of step ``k``. A run is split into one block
per message when each message's content is found, in order, in the run's decoded text (else it stays one block
naming all its roles). Tool calls (``<tool_call>...</tool_call>`` in an assistant turn, the format of
:mod:`agentrl.tools`) are marked as token ranges with the called names; env messages with role ``tool`` are
``tool`` blocks. A trajectory without tokens (a text-only policy) is drawn from its messages alone.

Everything here is data: the page renders strings with ``textContent`` only, so nothing in a trajectory can
become markup. Non-finite numbers become ``None`` (JSON has no NaN); log-probs are rounded to 5 decimals (the
page shows 4), which keeps a 64k-token view's JSON small. Misaligned token fields are cut to the
shortest and reported in ``warnings``.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from typing import Any

from agentrl.tools import JSON_ERRORS
from agentrl.viewer.data import finite_float
from agentrl.viewer.tokens import TokenDecoder

_TOOL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
MAX_FIELD_CHARS = 20_000  # info/task/error shown in the page (a huge info dict is cut, with a note)
DIFF_SEGMENT_TOKENS = 4000  # longer segments are diffed by common prefix/suffix only (difflib is quadratic)


def _finite(x: Any) -> float | None:
    return finite_float(x)


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _ints(xs: list[Any], default: int | None) -> list[int | None]:
    """``xs`` with anything but an int replaced by ``default`` (one type check per element; no copy when clean)."""
    if set(map(type, xs)) <= {int}:
        return xs
    return [x if type(x) is int else default for x in xs]


def _floats(xs: list[Any]) -> list[float | None]:
    """``xs`` with anything but a finite number replaced by ``None``."""
    if set(map(type, xs)) <= {float} and all(map(math.isfinite, xs)):
        return xs
    return [finite_float(x) if type(x) in (float, int) else None for x in xs]


def _text(x: Any, limit: int = MAX_FIELD_CHARS) -> str | None:
    if x is None:
        return None
    s = x if isinstance(x, str) else json.dumps(x, indent=1, default=str, ensure_ascii=False)
    return s if len(s) <= limit else s[:limit] + f"\n… ({len(s) - limit} more characters)"


def _messages(traj: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = traj.get("messages")
    out = []
    for m in msgs if isinstance(msgs, list) else []:
        if isinstance(m, dict):
            content = m.get("content")
            out.append({"role": str(m.get("role", "?")), "name": str(m["name"]) if m.get("name") else None,
                        "content": content if isinstance(content, str) else _text(content) or ""})
    return out


def _runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """``(value, start, end)`` of the maximal runs of equal loss-mask values."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


def _char_to_token(pieces: list[str], start: int, end: int) -> tuple[str, list[int]]:
    """The text of tokens ``start..end`` and each token's end offset in it."""
    ends, n = [], 0
    for p in pieces[start:end]:
        n += len(p)
        ends.append(n)
    return "".join(pieces[start:end]), ends


def _token_at(ends: list[int], char: int) -> int:
    """Index (relative) of the token holding character offset ``char``."""
    lo, hi = 0, len(ends) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ends[mid] > char:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _split_run(pieces: list[str] | None, start: int, end: int, msgs: list[dict[str, Any]],
               special: list[bool]) -> list[tuple[int, int]]:
    """Token ranges, one per message of ``msgs``, found by locating each message's content, in order, in the
    run's text. Between two contents the cut goes before the last special token of the gap (the next message's
    header, e.g. ``<|im_start|>``), else right after the first content."""
    if pieces is None or len(msgs) < 2:
        return [(start, end)]
    text, ends = _char_to_token(pieces, start, end)
    spans, cursor = [], 0
    for m in msgs:
        c = m["content"]
        at = text.find(c, cursor) if c else -1
        if at < 0:
            return [(start, end)]
        spans.append((at, at + len(c)))
        cursor = at + len(c)
    cuts = []
    for (_, prev_end), (next_start, _) in zip(spans, spans[1:]):
        lo = start + _token_at(ends, max(prev_end - 1, 0)) + 1  # first token after the previous content
        hi = start + _token_at(ends, next_start) if next_start < len(text) else end  # token of the next content
        cut = next((i for i in range(hi - 1, lo - 1, -1) if special[i]), lo)
        cuts.append(cut)
    bounds = [start, *cuts, end]
    if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
        return [(start, end)]
    return list(zip(bounds, bounds[1:]))


def _tool_calls(pieces: list[str] | None, start: int, end: int, text: str) -> tuple[list[str], list[list[int]]]:
    """Called tool names in an assistant turn and the token ranges of the calls."""
    names, ranges = [], []
    ends = None
    if pieces is not None:
        text, ends = _char_to_token(pieces, start, end)
    for m in _TOOL_RE.finditer(text):
        name = "?"
        try:
            obj = json.loads(m.group(1).strip())
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                name = obj["name"]
        except JSON_ERRORS:
            name = "malformed"
        names.append(name[:200])
        if ends is not None and m.end() > m.start():
            ranges.append([start + _token_at(ends, m.start()), start + _token_at(ends, m.end() - 1) + 1])
    return names, ranges


def _env_block(part: list[dict[str, Any]], start: int, end: int, with_text: bool,
               untokenized: bool = False) -> dict[str, Any]:
    roles = [m["role"] for m in part] or ["template"]
    kind = roles[0] if len(set(roles)) == 1 and roles[0] in ("system", "user", "tool", "template") else "env"
    b = {"kind": kind, "roles": roles, "start": start, "end": end, "names": [m["name"] for m in part if m["name"]],
         "text": "\n\n".join(m["content"] for m in part) if with_text else None}
    if untokenized:
        b["note"] = "after the last turn: not in the token stream"
    return b


def trajectory_view(traj: dict[str, Any], meta: dict[str, Any], decoder: TokenDecoder | None,
                    trainer: dict[str, Any] | None = None, row: dict[str, Any] | None = None) -> dict[str, Any]:
    """Returns the page's view of one trajectory (see the module docstring): ``meta``, ``tokens`` (aligned
    arrays: ``text``, ``ids``, ``mask``, ``version``, ``lp`` behaviour log-probs, ``tlp`` trainer log-probs,
    ``tool`` ranges), ``blocks`` and ``warnings``. ``trainer`` is a :class:`LogprobIndex` record, ``row`` the
    index's list fields of the line."""
    warnings: list[str] = []
    step = _int(meta.get("step"))
    fields = {}
    for name in ("token_ids", "loss_mask", "logprobs", "versions"):
        v = traj.get(name)
        if v is not None and not isinstance(v, list):
            warnings.append(f"'{name}' is not a list: ignored")
            v = None
        fields[name] = v or []
    n = len(fields["token_ids"])
    lengths = {k: len(v) for k, v in fields.items()}
    if n and len(set(lengths.values())) > 1:
        n = min(lengths.values())
        warnings.append(f"token fields have different lengths {lengths}: showing the first {n} tokens")
    ids = fields["token_ids"][:n]
    mask = [1 if m == 1 else 0 for m in fields["loss_mask"][:n]]
    versions = _ints(fields["versions"][:n], -1)
    lp = [round(x, 5) if m and x is not None else None for x, m in zip(_floats(fields["logprobs"][:n]), mask)]
    pieces, unknown = decoder.pieces(ids) if (decoder is not None and n) else (None, [])
    is_special = [decoder is not None and x in decoder.added for x in ids]
    if unknown:
        warnings.append(f"{len(unknown)} token ids outside the tokenizer's vocabulary (shown as ⟨id⟩)")
    tlp = None
    trainer_version = None
    if trainer is not None and n:
        rec = trainer["logprobs"]
        trainer_version = trainer.get("version")
        if len(rec) != n - 1:
            warnings.append(f"trainer log-probs: {len(rec)} values for {n - 1} token positions "
                            "(aligned from the start)")
        tlp = [None, *(None if x is None else round(x, 5) for x in rec[: n - 1])] + [None] * max(0, n - 1 - len(rec))

    msgs = _messages(traj)
    blocks: list[dict[str, Any]] = []
    rewards = [_finite(r) for r in traj.get("rewards", [])] if isinstance(traj.get("rewards"), list) else []
    tool_ranges: list[list[int]] = []
    if n:
        # Messages grouped as [opening, assistant_0, env_0, assistant_1, env_1, ...].
        opening: list[dict[str, Any]] = []
        turns: list[dict[str, Any]] = []
        env_after: list[list[dict[str, Any]]] = []
        for m in msgs:
            if m["role"] == "assistant":
                turns.append(m)
                env_after.append([])
            elif turns:
                env_after[-1].append(m)
            else:
                opening.append(m)
        k = 0  # assistant turn index
        shown_env: set[int] = set()
        for value, s, e in _runs(mask):
            if value == 1:
                text = turns[k]["content"] if k < len(turns) else ""
                names, ranges = _tool_calls(pieces, s, e, text)
                tool_ranges += ranges
                blocks.append({"kind": "assistant", "roles": ["assistant"], "start": s, "end": e, "turn": k,
                               "reward": rewards[k] if k < len(rewards) else None, "tool_calls": names,
                               "text": None if pieces is not None else text})
                k += 1
            else:
                group = opening if s == 0 else (env_after[k - 1] if 0 < k <= len(env_after) else [])
                if s > 0:
                    shown_env.add(k - 1)
                untokenized = []
                if pieces is not None and group:
                    run_text = "".join(pieces[s:e])
                    if not all(m["content"] in run_text for m in group if m["content"]):
                        # Only the closing tokens: the env's last messages came after the episode ended.
                        group, untokenized = [], group
                ranges_ = _split_run(pieces, s, e, group, is_special)
                for j, (bs, be) in enumerate(ranges_):
                    part = [group[j]] if len(ranges_) == len(group) and len(group) > 1 else group
                    blocks.append(_env_block(part, bs, be, pieces is None))
                blocks += [_env_block([m], e, e, True, untokenized=True) for m in untokenized]
        for j, group in enumerate(env_after):  # env messages with no token run after their turn
            if j not in shown_env:
                blocks += [_env_block([m], n, n, True, untokenized=True) for m in group]
        if k != len(turns):
            warnings.append(f"{k} generated token runs but {len(turns)} assistant messages: turns may be misattributed")
    else:
        k = 0
        for m in msgs:
            b = {"kind": m["role"] if m["role"] in ("system", "user", "tool", "assistant") else "env",
                 "roles": [m["role"]], "start": 0, "end": 0, "text": m["content"],
                 "names": [m["name"]] if m["name"] else []}
            if m["role"] == "assistant":
                b["turn"] = k
                b["reward"] = rewards[k] if k < len(rewards) else None
                b["tool_calls"], _ = _tool_calls(None, 0, 0, m["content"])
                k += 1
            blocks.append(b)

    row = row or {}
    return {
        "meta": {
            "id": str(traj.get("id", "")), "group_id": str(traj.get("group_id", "")),
            "env_id": str(traj.get("env_id", "")), "seed": _int(traj.get("seed")), "step": step,
            "trainer_version": trainer_version if trainer_version is not None else (step - 1 if step else None),
            "reward": _finite(traj.get("reward")), "rewards": rewards,
            "termination": str(traj.get("termination", "")), "error": _text(traj.get("error")),
            "num_turns": _int(traj.get("num_turns")), "prompt_len": _int(traj.get("prompt_len")),
            "timings": {str(k): _finite(v) for k, v in traj.get("timings", {}).items()}
            if isinstance(traj.get("timings"), dict) else {},
            "info": _text(traj.get("info")), "task": _text(traj.get("task")),
            "instance_id": _text(meta.get("instance_id"), 500), "success": meta.get("success")
            if isinstance(meta.get("success"), bool) else row.get("success"),
            "line": row.get("line"), "row": row.get("row"), "staleness": row.get("staleness"),
            "tokenizer": decoder.source if decoder is not None else None,
        },
        "tokens": {"n": n, "text": pieces, "ids": _ints(ids, None), "mask": mask,
                   "version": versions, "lp": lp, "tlp": tlp, "tool": tool_ranges,
                   "special": [i for i, sp in enumerate(is_special) if sp]},
        "blocks": blocks,
        "warnings": warnings,
    }


def diff_marks(a_ids: list[Any], a_mask: list[int], b_ids: list[Any], b_mask: list[int]) -> dict[str, Any]:
    """Per-token ``same`` flags (1: the token is matched in the other trajectory) for two trajectories of a group,
    and ``first_diff``, the first position where their token streams differ. Segments (loss-mask runs) are paired
    in order and diffed with :class:`difflib.SequenceMatcher`; a segment longer than ``DIFF_SEGMENT_TOKENS`` keeps
    only its common prefix and suffix."""
    same_a, same_b = [0] * len(a_ids), [0] * len(b_ids)
    first = next((i for i, (x, y) in enumerate(zip(a_ids, b_ids)) if x != y), min(len(a_ids), len(b_ids)))
    if first == len(a_ids) == len(b_ids):
        first = None
    ra, rb = _runs(a_mask), _runs(b_mask)
    for (va, sa, ea), (vb, sb, eb) in zip(ra, rb):
        x, y = a_ids[sa:ea], b_ids[sb:eb]
        if len(x) <= DIFF_SEGMENT_TOKENS and len(y) <= DIFF_SEGMENT_TOKENS:
            sm = difflib.SequenceMatcher(None, x, y, autojunk=False)
            for blk in sm.get_matching_blocks():
                for t in range(blk.size):
                    same_a[sa + blk.a + t] = 1
                    same_b[sb + blk.b + t] = 1
        else:
            p = 0
            while p < min(len(x), len(y)) and x[p] == y[p]:
                same_a[sa + p] = same_b[sb + p] = 1
                p += 1
            q = 0
            while q < min(len(x), len(y)) - p and x[-1 - q] == y[-1 - q]:
                same_a[ea - 1 - q] = same_b[eb - 1 - q] = 1
                q += 1
    return {"same_a": same_a, "same_b": same_b, "first_diff": first}
