"""The vLLM agent loop: a :class:`~agentrl.policy.Policy` that turns an episode into token ids, token-in/token-out.

One :class:`AgentLoopSession` per episode keeps the trajectory's token ids across turns; rendering is
:class:`agentrl.chat.ChatRenderer`'s (the model's own chat template, family and template mode from
``RolloutConfig.chat``):

- **Opening turn.** The env's opening messages are rendered with the chat template (``add_generation_prompt=True``)
  and tokenized; these are the prompt tokens (``loss_mask`` 0, ``prompt_len``).
- **Generated tokens** are appended exactly as the engine returned them (never decoded and re-encoded), with
  ``loss_mask`` 1, the engine's behavior log-prob and the weight version that produced each token. The turn is read
  with the family's tool-call format (:mod:`agentrl.chat.toolcalls`) into the structured assistant message the
  template gets in later renders (reasoning field, ``tool_calls`` with ids; tool messages that follow get the
  matching ``tool_call_id``). ``Action.text`` is for the env: the decoded text for the tiny model's format, else the
  content with the calls written in :mod:`agentrl.tools`' format; ``Action.tool_calls`` holds them OpenAI-style.
- **Assistant closing.** Chat templates end an assistant message with fixed text (Qwen: ``<|im_end|>\\n``), found
  once per tool set by rendering a marker message with the session's tools; call its tokens ``C``. After a turn's
  generated tokens ``G``, let ``k`` be the largest number with ``G[-k:] == C[:k]``; the loop appends ``C[k:]`` with
  ``loss_mask`` 0 (a turn that stopped on eos gets the missing ``\\n``, a turn cut by ``max_tokens`` the whole
  closing). A model that stops on the next message's role token (GLM's ``<|observation|>``) keeps it, and the
  next message is appended without it.
- **Both sides of every turn are checked.** After each generation, the conversation with the model's turn is
  re-rendered and compared with the prompt the model was given + its turn + the closing (``handover``); before each
  env turn, the rendering with the new messages must extend the stream (prefix-stable text, and no token merge at
  the boundary). Either drift is counted (``stats``, ``token_record().info``). An env turn that does not extend the
  stream is handled by the template mode: ``strict`` raises :class:`TemplateError`; ``keep`` appends what the
  template renders for the new messages after the model's own turn (history stays as the model saw it); ``split``
  starts a new segment whose prompt is the template's own rendering (each segment is one training sample with
  exactly its own context; ``TokenRecord.segments`` holds their lengths). Only the new text is tokenized when the
  boundary touches an added token, so a turn costs its renders plus its new tokens. Several messages of one step
  are rendered together (templates that group consecutive tool messages come out right).
- **Stop conditions.** The env ending the episode is the manager's job. The session returns an action with
  ``context_exhausted=True`` (the manager then truncates the episode) instead of generating when the episode has had
  ``max_turns`` turns (``finish_reason="max_turns"``) or when the new env tokens would leave no room for one
  generated token plus the closing within ``max_context_tokens`` (``finish_reason="max_context"``; those env tokens
  are then not appended, so every segment holds at most ``max_context_tokens`` tokens). A turn ends on the engine's
  stop (eos, stop strings, stop token ids) or on ``max_tokens_per_turn`` (or the room left in the context).
- **Aborted turns.** A request that comes back with ``finish_reason == "abort"`` (a weight update in abort mode) is
  resubmitted with ``prompt + tokens so far`` for the remaining tokens; tokens keep the version that produced them.
- **Queue scheduling.** Each session sends its own request as soon as its observation arrives; nothing waits for
  other trajectories.

:func:`rollout` runs a list of episodes through :class:`agentrl.manager.EnvManager` with any policy.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.chat import ChatConfig, ChatRenderer, Continuation, TemplateError, canonical_text
from agentrl.core import Message
from agentrl.inference.base import Generation, InferenceEngine, SamplingParams
from agentrl.inference.resubmit import BadGeneration, ResubmitError, derive_seed, generate_resubmitting
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord
from agentrl.trajectory import TokenTape

_ROLES = ("system", "user", "assistant", "tool")
ChatTokens = ChatRenderer  # the name this class had before it moved to agentrl.chat
__all__ = ["AgentLoopPolicy", "AgentLoopSession", "ChatTokens", "RolloutConfig", "TemplateError", "rollout"]


@dataclass
class RolloutConfig:
    """How the agent loop samples and when it stops.

    Sampling: ``temperature``, ``top_p``, ``top_k`` (-1: off), ``max_tokens_per_turn``, ``stop`` strings,
    ``stop_token_ids``, ``seed``. With a ``seed``, every request gets its own seed derived from (seed, trajectory
    id, turn, resubmission), so runs with the same trajectory ids repeat while the members of a group still differ.
    ``ignore_eos`` keeps generating past eos (benchmarks only).
    Limits: ``max_turns`` assistant turns per episode, ``max_context_tokens`` for the whole trajectory (lowered to
    the engine's ``max_model_len`` when the engine has a smaller one).
    ``tools``: pass the episode's tool schemas to the chat template. ``chat``: the model family, template mode and
    family options (:class:`agentrl.chat.ChatConfig`). ``chat_template_kwargs`` are passed to ``apply_chat_template``
    as they are. ``max_resubmits``: aborted requests of one turn that may be resubmitted before the turn fails.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens_per_turn: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    max_turns: int = 16
    max_context_tokens: int = 2048
    tools: bool = True
    chat: ChatConfig = field(default_factory=ChatConfig)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_resubmits: int = 64

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens_per_turn < 1:
            raise ValueError(f"max_tokens_per_turn must be >= 1, got {self.max_tokens_per_turn}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2, got {self.max_context_tokens}")
        if self.max_resubmits < 0:
            raise ValueError(f"max_resubmits must be >= 0, got {self.max_resubmits}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must hold non-empty strings, got {self.stop!r}")
        self.chat.validate()

    def sampling_params(self, max_tokens: int, seed: int | None) -> SamplingParams:
        """Returns the engine's params for one request of at most ``max_tokens`` tokens."""
        params = SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=max_tokens,
            stop=list(self.stop),
            stop_token_ids=list(self.stop_token_ids),
            seed=seed,
            ignore_eos=self.ignore_eos,
        )
        params.validate()
        return params


def _check_messages(messages: Any) -> list[Message]:
    if isinstance(messages, str):
        return [{"role": "user", "content": _unicode(messages)}]
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"new_messages must be a list of chat messages, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise ValueError(
                f"new_messages[{i}] must be a dict with role in {_ROLES} and a string content, got {m!r:.200}"
            )
        out.append(dict(m, content=_unicode(m["content"])))  # extra keys (tool_call_id, name) pass through
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode(text: str) -> str:
    """``text`` with each lone surrogate (an env's bytes decoded with surrogateescape, a JSON ``\\udc80``) read as
    U+FFFD, as undecodable bytes are: the tokenizer raises on them."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


class AgentLoopSession(PolicySession):
    """One episode's token-level state (see the module docstring for the rules).

    Invariants after every :meth:`act`: ``token_ids``, ``loss_mask``, ``logprobs`` and ``versions`` are aligned;
    ``loss_mask`` is 1 exactly on generated tokens, which carry the engine's log-prob and a version >= 0; every
    other token has log-prob 0.0 and version -1; each segment holds at most ``max_context_tokens`` tokens, and the
    tokens of a segment are exactly the prompt of its last request plus that request's output.
    ``stats`` counts ``requests``, ``resubmits``, ``generate_s`` (seconds awaiting the engine), ``drift_handover``
    (turns whose re-rendering differs from what the model saw and wrote), ``drift_env`` (env turns whose rendering
    does not extend the stream; handled by the template mode), ``segments`` and ``tool_parse_errors`` (malformed
    calls in the model's own format).
    """

    def __init__(self, policy: "AgentLoopPolicy", meta: EpisodeMeta):
        self.policy, self.meta = policy, meta
        self.tools: list[dict] | None = None  # resolved at the first act(), after the env's reset
        self.cfg = policy.cfg
        self.chat: ChatRenderer = policy.chat
        self.messages: list[Message] = []  # as the template reads them (structured assistant turns)
        self.tape = TokenTape()  # the trajectory's aligned token arrays so far
        self.prompt_len = 0
        self.turns = 0
        self.stats: dict[str, float] = {"requests": 0, "resubmits": 0, "generate_s": 0.0, "drift_handover": 0,
                                        "drift_env": 0, "segments": 1, "tool_parse_errors": 0}
        self.drifts: list[str] = []  # one line per drift (kind, turn, where), for the trajectory's info
        self._segments: list[int] = []  # lengths of the closed segments
        self._seg_start = 0
        self._text: str | None = None  # the current segment's text as the template sees it
        self._last_turn: dict[str, Any] | None = None
        self._stop_role = ""  # a role token the model stopped on (GLM), already in the stream
        self._closing: tuple[str, list[int]] = (self.chat.closing_text, self.chat.closing_ids)
        self._inflight: str | None = None
        self._closed = False
        # Tokens the next act() may generate at most (None: no cap beyond max_tokens_per_turn and the context); set
        # by a caller that bounds the whole episode's length (agentrl.controller.tail.BudgetPolicy).
        self.max_new_tokens: int | None = None

    # -- token bookkeeping ----------------------------------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        return self.tape.token_ids

    @property
    def loss_mask(self) -> list[int]:
        return self.tape.loss_mask

    @property
    def logprobs(self) -> list[float]:
        return self.tape.logprobs

    @property
    def versions(self) -> list[int]:
        return self.tape.versions

    def _append_fixed(self, ids: list[int]) -> None:
        self.tape.add_fixed(ids)

    def _append_generated(self, gen: Generation) -> None:
        self.tape.add_generated(gen.token_ids, gen.logprobs, gen.versions)

    def token_record(self) -> TokenRecord:
        segments = self._segments + [len(self.tape.token_ids) - self._seg_start] if self._segments else []
        info = {f"chat/{k}": self.stats[k] for k in ("drift_handover", "drift_env", "segments", "tool_parse_errors")}
        if self.drifts:
            info["chat/drifts"] = list(self.drifts[-8:])
        return TokenRecord(
            token_ids=list(self.tape.token_ids),
            loss_mask=list(self.tape.loss_mask),
            logprobs=list(self.tape.logprobs),
            versions=list(self.tape.versions),
            prompt_len=self.prompt_len,
            segments=segments,
            info=info,
        )

    def _drift(self, kind: str, detail: str) -> None:
        self.stats[f"drift_{kind}"] += 1
        self.policy.counts[f"drift_{kind}"] += 1
        self.drifts.append(f"turn {self.turns} {kind}: {detail[:200]}")

    # -- the turn -------------------------------------------------------------------------------------------------
    def _with_call_ids(self, msgs: list[Message]) -> list[Message]:
        """Tool messages answer the last turn's calls in order: they get its ``tool_call_id`` (and ``name``) when
        they lack them; for templates that refuse a tool message answering no call, such a message goes as a user
        message."""
        calls = (self._last_turn or {}).get("tool_calls") or []
        out, i = [], 0
        for m in msgs:
            if m["role"] == "tool":
                if i < len(calls):
                    m.setdefault("tool_call_id", calls[i]["id"])
                    m.setdefault("name", calls[i]["function"]["name"])
                elif self.chat.family.tool_needs_call and "tool_call_id" not in m:
                    m = {"role": "user", "content": m["content"]}
                i += 1
            out.append(m)
        return out

    def _next_prompt(self, msgs: list[Message]) -> tuple[Continuation, list[Message]]:
        if self._text is None:
            self.tools = self.policy.tools_for(self.meta)
            self._closing = self.chat.closing(self.tools)
            text, ids = self.chat.prompt(msgs, self.tools)
            return Continuation("append", ids, text, rendered=text), msgs
        msgs = self._with_call_ids(msgs)
        convo = self.messages + msgs
        c = self.chat.continue_from(self._text, convo, self.tools)
        if c.kind == "drift":
            self._drift("env", c.reason)
            if self.chat.mode == "strict":
                raise TemplateError(f"chat template is not prefix-stable: {c.reason}; set rollout.chat.template_mode "
                                    f"to keep or split to train on such a template")
            if self.chat.mode == "keep":
                text = self.chat.keep_suffix(self._last_turn or {"role": "assistant", "content": ""}, msgs,
                                             self._stop_role)
                c = Continuation("keep", self.chat.encode(text), text, c.at, c.reason, c.rendered)
        return c, convo

    async def act(self, new_messages: list[Message]) -> Action:
        if self._closed:
            raise RuntimeError(f"session {self.meta.trajectory_id} is closed")
        msgs = _check_messages(new_messages)
        if self.turns >= self.cfg.max_turns:
            return Action(text="", finish_reason="max_turns", context_exhausted=True)
        if self._text is None and not msgs:
            raise ValueError("the first act() needs the env's opening messages")
        c, convo = self._next_prompt(msgs)
        new_segment = c.kind == "drift"
        closing_ids = self._closing[1]
        used = 0 if new_segment else len(self.tape.token_ids) - self._seg_start
        room = self.policy.max_context_tokens - used - len(c.ids) - len(closing_ids)
        if room < 1:
            return Action(text="", finish_reason="max_context", context_exhausted=True)
        if new_segment:
            self._segments.append(len(self.tape.token_ids) - self._seg_start)
            self._seg_start = len(self.tape.token_ids)
            self.stats["segments"] += 1
            self._text = c.text
        else:
            self._text = (self._text or "") + c.text
        self._append_fixed(c.ids)
        self.messages = convo
        if self.turns == 0:
            self.prompt_len = len(self.tape.token_ids)
        prompt_render = c.rendered or self._text
        gen_prefix = "" if self.chat.family.tool_parser == "agentrl" else self.chat.generation_prefix(self._text)

        context = self.tape.token_ids[-4:]
        limit = min(self.cfg.max_tokens_per_turn, room)
        if self.max_new_tokens is not None:
            limit = max(1, min(limit, self.max_new_tokens))
        gen = await self._generate(limit)
        self._append_generated(gen)
        end = self.chat.end_turn(context, gen.token_ids, self.tools)
        self._append_fixed(end.append_ids)
        text, self._stop_role = end.text, end.stop_role
        turn, msg = self.chat.read_turn(gen_prefix + text, end.text_ids, self.tools,
                                        seed=f"{self.meta.trajectory_id}/{self.turns}")
        self.stats["tool_parse_errors"] += len(turn.errors)
        self.policy.counts["tool_parse_errors"] += len(turn.errors)
        if self.chat.family.tool_parser == "agentrl":
            msg = {"role": "assistant", "content": text}  # the tiny model's template reads its calls from the text
        self.messages = self.messages + [msg]
        self._last_turn = msg
        self._text += end.stream_text
        drift = self.chat.handover(self.messages, prompt_render + text + end.end_text, len(prompt_render), self.tools)
        if drift is not None:
            self._drift("handover", f"{drift[1]} differs at character {drift[0]}")
        self.turns += 1
        native = self.chat.family.tool_parser != "agentrl"
        return Action(
            text=canonical_text(turn) if native else text,
            token_ids=list(gen.token_ids),
            logprobs=list(gen.logprobs),
            versions=list(gen.versions),
            finish_reason=gen.finish_reason,
            tool_calls=turn.openai_tool_calls(),
        )

    async def _generate(self, max_tokens: int) -> Generation:
        """Returns this turn's tokens; aborted requests are resubmitted with the tokens so far
        (:func:`agentrl.inference.resubmit.generate_resubmitting`)."""
        tid, turn = self.meta.trajectory_id, self.turns
        t0 = time.perf_counter()

        def track(rid: str | None) -> None:
            self._inflight = rid
            if rid is not None:
                self.stats["requests"] += 1

        try:
            out, resubmits = await generate_resubmitting(
                self.policy.engine, self.tape.token_ids[self._seg_start:], self.cfg.sampling_params(max_tokens, None),
                request_id=lambda a: f"{tid}-t{turn}-r{a}", session_id=tid, max_resubmits=self.cfg.max_resubmits,
                seed=lambda a: derive_seed(self.cfg.seed, tid, turn, a), closed=lambda: self._closed,
                on_request=track)
        except (ResubmitError, BadGeneration) as e:
            raise type(e)(f"trajectory {tid} turn {turn}: {e}") from None
        finally:
            self.stats["generate_s"] += time.perf_counter() - t0
        self.stats["resubmits"] += resubmits
        return out

    async def aclose(self) -> None:
        self._closed = True
        rid, self._inflight = self._inflight, None
        if rid is not None:
            await self.policy.engine.abort(rid)


class AgentLoopPolicy(Policy):
    """The token-in/token-out policy over an :class:`InferenceEngine`.

    ``tokenizer`` must be the engine's tokenizer (with a chat template). ``tools``: tool schemas (OpenAI style, as
    ``agentrl.tools.ToolSet.schemas()`` returns) given to the chat template for every episode, unless the episode
    brings its own: a ``tools`` attribute on ``meta`` (e.g. set by the manager from ``reset``'s ``info["tools"]``
    before the first ``act``) or ``meta.task["tools"]`` when the task is a mapping. ``cfg.tools=False`` gives the
    template none. Tools are resolved at a session's first ``act``.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        tokenizer: Any,
        cfg: RolloutConfig | None = None,
        *,
        tools: list[dict] | None = None,
    ):
        self.engine = engine
        self.cfg = cfg or RolloutConfig()
        self.cfg.validate()
        self.chat = ChatRenderer(tokenizer, self.cfg.chat, self.cfg.chat_template_kwargs)
        self.tools = tools
        self.sessions_opened = 0
        self.counts: dict[str, int] = {"drift_handover": 0, "drift_env": 0, "tool_parse_errors": 0}
        # The context bound: the config's, or the engine's max_model_len when that is smaller.
        engine_len = getattr(engine, "max_model_len", None)
        self.max_context_tokens = min(self.cfg.max_context_tokens, engine_len or self.cfg.max_context_tokens)

    def tools_for(self, meta: EpisodeMeta) -> list[dict] | None:
        """Returns the tool schemas the template gets for this episode (None when tools are off or absent)."""
        if not self.cfg.tools:
            return None
        tools = getattr(meta, "tools", None)
        if tools is None and isinstance(meta.task, dict):
            tools = meta.task.get("tools")
        return tools if tools is not None else self.tools

    def session(self, meta: EpisodeMeta) -> AgentLoopSession:
        self.sessions_opened += 1
        return AgentLoopSession(self, meta)

    def metrics(self) -> dict[str, float]:
        """Returns counters over all sessions: ``chat/drift_handover``, ``chat/drift_env``, ``chat/tool_parse_errors``
        (see :class:`AgentLoopSession`) and ``chat/sessions``."""
        out = {f"chat/{k}": float(v) for k, v in self.counts.items()}
        out["chat/sessions"] = float(self.sessions_opened)
        return out

    @property
    def version(self) -> int:
        return self.engine.version


async def rollout(specs: Any, policy: Policy, config: Any = None) -> list[Any]:
    """Runs one episode per :class:`agentrl.manager.EpisodeSpec` in ``specs`` with ``policy`` through an
    :class:`agentrl.manager.EnvManager` (``config``: its ``ManagerConfig``; default: envs in this process) and
    returns the trajectories in input order. A thin convenience over ``EnvManager.run_episodes``."""
    from agentrl.manager import EnvManager, ManagerConfig

    async with EnvManager(config or ManagerConfig(), policy) as mgr:
        return await mgr.run_episodes(specs)
