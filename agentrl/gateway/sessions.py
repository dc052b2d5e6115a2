"""Trajectory assembly per session: every request's exact prompt and sampled tokens, as training segments.

A session's tokens are a list of **segments**; each segment is one training sample whose tokens are exactly a
context the engine was given followed by what it sampled (and the template's closing). For each request:

1. **Render.** Chat requests are rendered with the model's chat template by the shared renderer
   (:class:`agentrl.chat.ChatRenderer`); completions prompts are taken as they are (text or token ids). An
   assistant message the client sends back unchanged (same content, tool calls and call ids as the gateway
   returned) is rendered as the gateway recorded it (reasoning field, the model's own argument text), so clients
   that drop fields they do not know do not cause drift.
2. **Match.** The rendering is compared with every segment's text: when it extends one (text prefix, and the
   renderer's token-boundary check holds), the request **appends** to the longest such segment: its prompt is that
   segment's tokens (never re-encoded) plus the new tokens. Otherwise (the harness edited or compacted history,
   stripped ``<think>``, or the template rewrites the past) it is a **drift**: a new segment starts whose prompt is
   the whole rendering, so it is trained on exactly the context the model saw. Nothing is masked or dropped.
3. **Sample.** ``n`` completions are sampled (aborted engine requests are resubmitted with the tokens so far; every
   token keeps the version that produced it). The closing the model did not generate is appended (mask 0), as in
   the agent loop (:meth:`ChatRenderer.end_turn`).
4. **Commit.** The first completion extends the matched segment in place when nothing else extended it meanwhile;
   every other completion (``n > 1``, or a concurrent request on the same segment) becomes its own segment whose
   copied prefix is context (loss mask 0: its generated tokens are trained once, in the segment they were sampled
   in). So **every sampled token is trained exactly once**, with its behaviour log-prob and version.

``n > 1``: all ``n`` completions are recorded and trained with the session's reward (the completion the harness
continues gets the later turns appended; the others are segments that end there). A request that fails (bad
input, engine error, the session ended while it was sampled) changes nothing in its session. A request whose client
hung up is cancelled, streamed or not (:mod:`~agentrl.gateway.streaming`: at the first write that finds the client
gone, or within ``HANG_UP_POLL_S`` for a whole answer): its engine request is aborted and nothing of it is recorded,
so a client's retry is a new request on the session as it was. Ending a session aborts its engine requests in
flight.

Modules: :mod:`~agentrl.gateway.planning` (segments, steps 1-2, in a worker thread), :mod:`~agentrl.gateway.choices`
(reading generations into the client's choices), this module (sampling and the commit, on the event loop). A session
knows its gateway only through its :class:`SessionContext` (renderer, engine, bounds, the worker thread) and tells
it about commits through ``on_commit``; the live sessions, their bounds and the gateway's counters are
:class:`agentrl.gateway.store.SessionStore`'s.

Invariants (checked by :meth:`Session.token_record` through :meth:`agentrl.trajectory.Trajectory.validate`): token
fields aligned; loss mask 1 exactly on sampled tokens, which carry the engine's log-prob and a version >= 0; every
segment is at most ``max_model_len`` tokens.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from agentrl.chat import ChatRenderer
from agentrl.gateway.choices import Choice, Completion, assistant_key, read_chat, read_completion
from agentrl.gateway.config import GatewayConfig
from agentrl.gateway.live import LiveRequest
from agentrl.gateway.planning import Plan, Segment, Snapshot, plan_chat, plan_prompt, snapshot
from agentrl.gateway.protocol import APIError, ChatRequest, CompletionRequest, Sampling, bad
from agentrl.inference.base import Generation, InferenceEngine, SamplingParams
from agentrl.inference.resubmit import derive_seed, generate_resubmitting
from agentrl.policy import TokenRecord
from agentrl.tools import JSON_ERRORS
from agentrl.trajectory import Trajectory

Live = LiveRequest | None  # a streamed request's listener (see :mod:`agentrl.gateway.live`)

__all__ = ["Choice", "Completion", "Segment", "Session", "SessionContext"]


def _size(req: ChatRequest | CompletionRequest, snap: Snapshot) -> int | None:
    """What rendering ``req`` may cost, in characters: its body plus the session's longest recorded text (history the
    gateway holds, e.g. a ``previous_response_id``'s, is rendered too); ``None`` when the body's size is unknown."""
    if req.body_bytes is None:
        return None
    return req.body_bytes + max((len(text) for _, text, _ in snap), default=0)


@dataclass
class SessionContext:
    """What every session of one gateway shares, read-only: the renderer and engine, the config and the bounds
    derived from the engine (``max_model_len``, ``max_tokens``, ``vocab_size``: 0 when unknown), and ``offload``,
    which runs a planning function in the gateway's worker thread (bounded by ``render_timeout_s``)."""

    renderer: ChatRenderer
    engine: InferenceEngine
    cfg: GatewayConfig
    max_model_len: int
    max_tokens: int
    vocab_size: int
    offload: Callable[..., Awaitable[Any]]


class Session:
    """One harness conversation's token record (see the module docstring). Created by
    :class:`~agentrl.gateway.store.SessionStore`.

    ``meta``: what the creator attached (trajectory and group ids, task). ``on_commit`` (the store's counters) and
    then ``listeners`` (the manager integration, which turns them into actions) are called with every
    :class:`Completion` once it is committed."""

    def __init__(self, sid: str, ctx: SessionContext, meta: dict[str, Any] | None = None,
                 on_commit: Callable[[Completion], None] | None = None):
        self.id, self.ctx, self.meta, self.on_commit = sid, ctx, dict(meta or {}), on_commit
        self.r: ChatRenderer = ctx.renderer
        self.segments: list[Segment] = []
        self.requests = 0
        self.closed = False
        self.created = self.last_used = time.monotonic()
        self.inflight = 0
        self.stats: dict[str, int] = {"requests": 0, "choices": 0, "drifts": 0, "appends": 0, "substituted": 0,
                                      "tool_calls": 0, "parse_errors": 0, "sampled_tokens": 0, "resubmits": 0}
        self.drifts: list[str] = []
        self.last_messages: list[dict[str, Any]] = []
        self.listeners: list[Callable[[Completion], None]] = []
        self._ours: dict[str, dict[str, Any]] = {}
        self._live: set[str] = set()  # engine request ids in flight
        self._aborts: set[asyncio.Task] = set()

    # -- sizes ------------------------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    def _check_open(self) -> None:
        if self.closed:
            raise APIError(409, f"session {self.id!r} has ended; start a new session", "invalid_request_error",
                           None, "session_ended")

    def close(self) -> None:
        """Ends the session: later requests get 409, and the engine requests in flight are aborted (an episode
        cancelled for staleness, or ended while its harness still waits, stops using the engine at once); their
        requests then fail with 409 and record nothing more."""
        if self.closed:
            return
        self.closed = True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a synchronous caller): nothing can be in flight either
        for rid in list(self._live):
            task = loop.create_task(self.ctx.engine.abort(rid))
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)

    # -- planning -------------------------------------------------------------------------------------------------
    def _for_template(self, messages: list[dict[str, Any]], record: bool = True) -> list[dict[str, Any]]:
        """The request's messages as the template reads them: assistant turns the gateway returned are swapped for
        the message it recorded; other assistant tool calls get their arguments in the family's form."""
        out = []
        for m in messages:
            if m["role"] == "assistant":
                ours = self._ours.get(assistant_key(m.get("content"), m.get("tool_calls") or []))
                if ours is not None:
                    self.stats["substituted"] += record
                    out.append(copy.deepcopy(ours))
                    continue
                if m.get("tool_calls") and self.r.family.arguments == "dict":
                    m = dict(m)
                    calls = []
                    for c in m["tool_calls"]:
                        try:
                            args: Any = json.loads(c["function"]["arguments"] or "{}")
                        except JSON_ERRORS:
                            args = c["function"]["arguments"]
                        calls.append({**c, "function": {**c["function"], "arguments": args}})
                    m["tool_calls"] = calls
            out.append(m)
        return out

    # -- sampling ---------------------------------------------------------------------------------------------------
    def _params(self, s: Sampling, room: int) -> SamplingParams:
        cfg = self.ctx.cfg
        cap = self.ctx.max_tokens
        if s.max_tokens is not None and s.max_tokens > cap:
            raise bad("max_tokens", f"max_tokens={s.max_tokens} is over this gateway's limit of {cap}",
                      "max_tokens_too_large")
        client = cfg.sampling == "client"
        return SamplingParams(
            temperature=s.temperature if client and s.temperature is not None else cfg.temperature,
            top_p=s.top_p if client and s.top_p is not None else cfg.top_p,
            top_k=s.top_k if client and s.top_k is not None else cfg.top_k,
            max_tokens=max(1, min(s.max_tokens or cap, room)),
            stop=list(s.stop),
            seed=s.seed,
            ignore_eos=s.ignore_eos,
            stream_interval=cfg.stream_interval,
        )

    async def _sample(self, prompt: list[int], params: SamplingParams, rid: str,
                      on_tokens: Callable[[list[int]], None] | None = None) -> Generation:
        """Returns one completion's tokens; aborted requests (weight updates in abort mode) are resubmitted with the
        tokens so far (:func:`agentrl.inference.resubmit.generate_resubmitting`, the agent loop's rule), each token
        keeping the version that produced it."""
        live: list[str] = []

        def track(req: str | None) -> None:
            if req is None:
                self._live.difference_update(live)
                live.clear()
            else:
                live.append(req)
                self._live.add(req)

        out, resubmits = await generate_resubmitting(
            self.ctx.engine, prompt, params, request_id=lambda a: f"{rid}-r{a}", session_id=self.id,
            max_resubmits=self.ctx.cfg.max_resubmits, seed=lambda a: derive_seed(params.seed, rid, a),
            closed=lambda: self.closed, on_request=track, on_tokens=on_tokens)
        self.stats["resubmits"] += resubmits
        return out

    async def _sample_n(self, plan: Plan, s: Sampling, live: Live = None) -> tuple[list[Generation], SamplingParams]:
        r = self.r
        closing = len(r.closing_ids)
        limit = self.ctx.max_model_len
        room = limit - len(plan.prompt_ids) - closing
        if room < 1:
            raise bad("messages", f"this model's maximum context length is {limit} tokens; the prompt has "
                                  f"{len(plan.prompt_ids)} (plus {closing} for the closing), which leaves no room to "
                                  f"generate", "context_length_exceeded")
        if s.n > self.ctx.cfg.max_n:
            raise bad("n", f"n={s.n} is over this gateway's limit of {self.ctx.cfg.max_n}")
        params = self._params(s, room)
        budget = self.ctx.cfg.max_session_tokens - self.num_tokens
        need = s.n * (len(plan.prompt_ids) + params.max_tokens + closing)
        if need > budget:
            raise bad(None, f"session {self.id!r} would exceed max_session_tokens="
                            f"{self.ctx.cfg.max_session_tokens} ({self.num_tokens} recorded, up to {need} more); end "
                            f"the session and start a new one", "session_token_limit")
        base_seed = params.seed
        if live is not None:
            live.started(plan.prompt_ids, plan.text, s.n, list(params.stop))
        tell = (lambda i: (lambda ids: live.tokens(i, ids))) if live is not None else (lambda i: None)
        if s.n == 1:
            return [await self._sample(plan.prompt_ids, params, f"gw-{self.id}-{self.requests}-0", tell(0))], params
        tasks = [asyncio.ensure_future(self._sample(
            plan.prompt_ids, dataclasses.replace(params, seed=derive_seed(base_seed, i) if base_seed is not None else None),
            f"gw-{self.id}-{self.requests}-{i}", tell(i))) for i in range(s.n)]
        try:
            gens = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return list(gens), params

    # -- requests ---------------------------------------------------------------------------------------------------
    async def count_tokens(self, req: ChatRequest) -> int:
        """The prompt tokens the engine would be given for ``req`` now (its ``usage`` input count), rendered and
        planned as :meth:`chat` would, with nothing sampled or recorded."""
        self._check_open()
        self._begin()
        try:
            msgs = self._for_template(req.messages, record=False)
            snap = snapshot(self.segments)
            plan = await self.ctx.offload(plan_chat, self.r, msgs, req.tools, snap, size=_size(req, snap))
        finally:
            self.inflight -= 1
        return len(plan.prompt_ids)

    async def chat(self, req: ChatRequest, live: Live = None) -> Completion:
        """Serves one chat-completions request (see the module docstring); raises :class:`APIError` for requests
        that cannot be served (the session is then unchanged). ``live`` (streaming) is told when sampling starts
        and every choice's tokens as the engine produces them; the record is the same with or without it."""
        self._check_open()
        tools = req.tools
        self._begin()  # in flight from here: the session is neither expired nor forgotten while it renders
        try:
            msgs = self._for_template(req.messages)
            snap = snapshot(self.segments)
            plan = await self.ctx.offload(plan_chat, self.r, msgs, tools, snap, size=_size(req, snap))
            self._check_open()
            gens, _ = await self._sample_n(plan, req.sampling, live)
        finally:
            self.inflight -= 1
        self._check_open()  # ended while the engine was sampling: its trajectory is already taken
        choices = []
        for i, g in enumerate(gens):
            choice, msg = read_chat(self.r, plan.prompt_ids, plan.text, g, tools, req.tool_choice, i,
                                    req.sampling.logprobs, f"{self.id}/{self.requests}/{i}")
            self._ours[assistant_key(choice.content, choice.tool_calls)] = msg
            choices.append(choice)
        self.last_messages = req.messages
        return self._commit(plan, choices)

    async def complete(self, req: CompletionRequest, live: Live = None) -> Completion:
        """Serves one completions request (text prompt or token ids), as :meth:`chat` does."""
        self._check_open()
        self._begin()
        try:
            vocab = self.ctx.vocab_size

            def in_vocab(ids: list[int]) -> None:
                if vocab and any(t >= vocab for t in ids):
                    raise bad("prompt", f"prompt has token ids outside the vocabulary [0, {vocab})")

            if isinstance(req.prompt, list):
                in_vocab(req.prompt)  # before the plan decodes them: an id past the tokenizer's integer type raises
            snap = snapshot(self.segments)
            plan = await self.ctx.offload(plan_prompt, self.r, req.prompt, snap, size=_size(req, snap))
            in_vocab(plan.prompt_ids)
            self._check_open()
            gens, _ = await self._sample_n(plan, req.sampling, live)
        finally:
            self.inflight -= 1
        self._check_open()  # ended while the engine was sampling: its trajectory is already taken
        choices = [read_completion(self.r, plan.prompt_ids, g, i, req.sampling.logprobs) for i, g in enumerate(gens)]
        return self._commit(plan, choices)

    def _begin(self) -> None:
        self.inflight += 1
        self.last_used = time.monotonic()

    def _commit(self, plan: Plan, choices: list[Choice]) -> Completion:
        """Records the choices (see the module docstring, step 4); never awaits, so commits are atomic."""
        self.requests += 1
        appended = False
        for ch in choices:
            gen = Generation(ch.token_ids, ch.logprobs, ch.versions, "stop")
            if plan.base is not None and not appended and len(plan.base.token_ids) == plan.base_len \
                    and any(s is plan.base for s in self.segments):
                seg = plan.base
                seg.add_fixed(plan.new_ids)
                appended = True
            else:
                seg = Segment()
                if plan.base is not None:  # the shared prefix is context here: it is trained in its own segment
                    seg.add_fixed(plan.base.token_ids[:plan.base_len])
                seg.add_fixed(plan.new_ids)
                self.segments.append(seg)
            seg.add_generation(gen)
            seg.add_fixed(ch.stream_ids)
            seg.text = plan.text + ch.stream_text
        st = self.stats
        st["requests"] += 1
        st["choices"] += len(choices)
        st["drifts"] += plan.drift
        st["appends"] += plan.base is not None
        st["tool_calls"] += sum(len(c.tool_calls) for c in choices)
        st["parse_errors"] += sum(bool(c.parse_errors) for c in choices)
        st["sampled_tokens"] += sum(len(c.token_ids) for c in choices)
        if plan.drift:
            self.drifts.append(f"request {self.requests}: {plan.reason[:300]}")
        self.last_used = time.monotonic()
        done = Completion(self.id, self.requests, choices, len(plan.prompt_ids), plan.base is not None, plan.drift,
                          plan.reason)
        if self.on_commit is not None:
            self.on_commit(done)
        for fn in list(self.listeners):
            fn(done)
        return done

    # -- the record -------------------------------------------------------------------------------------------------
    def token_record(self) -> TokenRecord:
        """Returns the session's tokens: the segments concatenated, ``segments`` their lengths (empty for one)."""
        ids: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        vs: list[int] = []
        for s in self.segments:
            ids += s.token_ids
            mask += s.loss_mask
            lps += s.logprobs
            vs += s.versions
        first = self.segments[0].prompt_len if self.segments else 0
        return TokenRecord(ids, mask, lps, vs, max(first, 0),
                           [len(s.token_ids) for s in self.segments] if len(self.segments) > 1 else [],
                           self.info())

    def info(self) -> dict[str, Any]:
        st = self.stats
        out: dict[str, Any] = {f"gateway/{k}": v for k, v in st.items()}
        out["gateway/segments"] = len(self.segments)
        out["gateway/drift_rate"] = st["drifts"] / max(st["requests"] - 1, 1)
        if self.drifts:
            out["gateway/drift_reasons"] = self.drifts[-8:]
        return out

    def trajectory(self, reward: float = 0.0, info: dict[str, Any] | None = None,
                   termination: str = "terminated") -> Trajectory:
        """Returns the session as a :class:`Trajectory` (validated) with ``reward``."""
        rec = self.token_record()
        t = Trajectory(id=str(self.meta.get("trajectory_id", self.id)), group_id=str(self.meta.get("group_id", self.id)),
                       env_id=str(self.meta.get("env_id", "gateway")), seed=self.meta.get("seed"),
                       task=self.meta.get("task"), token_ids=rec.token_ids, loss_mask=rec.loss_mask,
                       logprobs=rec.logprobs, versions=rec.versions, prompt_len=rec.prompt_len, segments=rec.segments,
                       messages=list(self.last_messages), rewards=[float(reward)], reward=float(reward),
                       termination=termination,  # type: ignore[arg-type]
                       num_turns=self.requests, info={**(info or {}), **rec.info},  # the counters win
                       timings={"total_s": time.monotonic() - self.created})
        t.validate()
        return t
