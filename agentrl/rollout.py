"""The vLLM agent loop: a :class:`~agentrl.policy.Policy` that turns an episode into token ids, token-in/token-out.

One :class:`AgentLoopSession` per episode keeps the trajectory's token ids across turns:

- **Opening turn.** The env's opening messages are rendered with the chat template (``add_generation_prompt=True``)
  and tokenized; these are the prompt tokens (``loss_mask`` 0, ``prompt_len``).
- **Generated tokens** are appended exactly as the engine returned them (never decoded and re-encoded), with
  ``loss_mask`` 1, the engine's behavior log-prob and the weight version that produced each token.
  ``Action.text`` is their decoded text (without the closing tokens matched below and trailing special tokens
  such as eos), for the env only.
- **Assistant closing.** Chat templates end an assistant message with fixed text (Qwen: ``<|im_end|>\\n``). The
  policy finds that text once, by rendering an assistant message whose content is a marker and taking what follows
  the marker; call its tokens ``C``. After a turn's generated tokens ``G``, let ``k`` be the largest number
  ``0 <= k <= len(C)`` with ``G[-k:] == C[:k]`` (the part of the closing the model already produced, e.g. the
  ``<|im_end|>`` it stopped on); the loop appends ``C[k:]`` with ``loss_mask`` 0. So a turn that stopped on eos gets
  the missing ``\\n``, a turn cut by ``max_tokens`` gets the whole ``<|im_end|>\\n``, and the token stream always
  matches what the template would put between turns (the classic lost newline at turn boundaries cannot happen).
- **Env turns.** The conversation (assistant turns as their decoded text) is rendered without the new messages
  (``add_generation_prompt=False``) and with them (``add_generation_prompt=True``); the second must start with the
  first (else :class:`TemplateError`: the template is not prefix-stable), and the token difference
  ``encode(with)[len(encode(without)):]`` is appended with ``loss_mask`` 0. When the boundary touches an added token
  (Qwen: ``...<|im_end|>\\n`` | ``<|im_start|>user...``) the two sides tokenize independently, so only the new text
  is tokenized (cost per turn: the renders plus the new tokens, not the whole conversation); otherwise both are
  tokenized and the token prefix is checked as well. Several messages of one step (e.g. tool results, role
  ``tool``) are rendered together, so templates that group consecutive tool messages come out right.
- **Stop conditions.** The env ending the episode is the manager's job. The session returns an action with
  ``context_exhausted=True`` (the manager then truncates the episode) instead of generating when the episode has had
  ``max_turns`` turns (``finish_reason="max_turns"``) or when the new env tokens would leave no room for one
  generated token plus the closing within ``max_context_tokens`` (``finish_reason="max_context"``; those env tokens
  are then not appended, so ``len(token_ids) <= max_context_tokens`` always holds). A turn ends on the engine's
  stop (eos, stop strings, stop token ids) or on ``max_tokens_per_turn`` (or the room left in the context).
- **Aborted turns.** A request that comes back with ``finish_reason == "abort"`` (a weight update in abort mode) is
  resubmitted with ``prompt + tokens so far`` for the remaining tokens; tokens keep the version that produced them.
- **Queue scheduling.** Each session sends its own request as soon as its observation arrives; nothing waits for
  other trajectories.

:func:`rollout` runs a list of episodes through :class:`agentrl.manager.EnvManager` with any policy.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from agentrl.core import Message
from agentrl.inference.base import Generation, InferenceEngine, SamplingParams
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord

_MARKER = "\u2063AGENTRL-CLOSING-MARKER\u2063"
_ROLES = ("system", "user", "assistant", "tool")


class TemplateError(ValueError):
    """The chat template cannot be used token-in/token-out (not prefix-stable, or no recognisable closing)."""


@dataclass
class RolloutConfig:
    """How the agent loop samples and when it stops.

    Sampling: ``temperature``, ``top_p``, ``top_k`` (-1: off), ``max_tokens_per_turn``, ``stop`` strings,
    ``stop_token_ids``, ``seed``. With a ``seed``, every request gets its own seed derived from (seed, trajectory
    id, turn, resubmission), so runs with the same trajectory ids repeat while the members of a group still differ.
    ``ignore_eos`` keeps generating past eos (benchmarks only).
    Limits: ``max_turns`` assistant turns per episode, ``max_context_tokens`` for the whole trajectory (lowered to
    the engine's ``max_model_len`` when the engine has a smaller one).
    ``tools``: pass the episode's tool schemas to the chat template. ``chat_template_kwargs`` are passed to
    ``apply_chat_template`` (e.g. ``enable_thinking``). ``max_resubmits``: aborted requests of one turn that may be
    resubmitted before the turn fails.
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


class ChatTokens:
    """The chat template of one tokenizer, as token ids: rendering, the assistant closing, prefix-stable deltas.

    ``tokenizer`` is a Hugging Face tokenizer with a chat template. Rendering is text-level
    (``apply_chat_template(tokenize=False)``) and tokenization never adds special tokens of its own (the template
    writes any BOS it wants).
    """

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template")
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # Added tokens (specials like <|im_start|> included) are split out of the text before the tokenizer's model
        # runs, so text on either side of one is tokenized independently.
        added = getattr(tokenizer, "get_added_vocab", lambda: {})()
        self.added_tokens: tuple[str, ...] = tuple(sorted(added, key=len, reverse=True))
        self.closing_text = self._find_closing()
        self.closing_ids: list[int] = self.encode(self.closing_text)
        # Trailing special tokens (eos, or e.g. <|endoftext|> from generation_config's extra eos ids) are not text.
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_ids: set[int] = set(getattr(tokenizer, "all_special_ids", None) or ())
        self.eos_ids |= {eos} if isinstance(eos, int) else set(eos or ())

    def render(self, messages: list[Message], *, add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        """Returns the template's text for ``messages``."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False, **self.kwargs
        )
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:  # the Rust tokenizer itself: same ids, a fraction of the Python overhead
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _find_closing(self) -> str:
        convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARKER}]
        text = self.render(convo, add_generation_prompt=False)
        at = text.rfind(_MARKER)
        if at < 0:
            raise TemplateError("the chat template does not render an assistant message's content verbatim")
        return text[at + len(_MARKER):]

    def closing_overlap(self, generated: list[int]) -> int:
        """Returns the largest ``k`` with ``generated[-k:] == closing_ids[:k]`` (0 if none)."""
        c = self.closing_ids
        for k in range(min(len(c), len(generated)), 0, -1):
            if generated[-k:] == c[:k]:
                return k
        return 0

    def delta(self, prev_text: str, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """Returns the tokens the template adds for the last messages of ``messages`` plus the generation prompt,
        given ``prev_text``, the rendering of the conversation before them (without generation prompt): the token
        difference ``encode(next)[len(encode(prev_text)):]`` where ``next`` is the rendering with them.

        The rendering with the new messages must start with ``prev_text``, else :class:`TemplateError` (the
        template is not prefix-stable). When the boundary touches an added token (``...<|im_end|>\n`` |
        ``<|im_start|>...``), the two sides tokenize independently and only the new text is tokenized; otherwise
        both renderings are tokenized and the token prefix is checked too.
        """
        role = messages[-1].get("role") if messages else None
        text = self.render(messages, add_generation_prompt=True, tools=tools)
        if not text.startswith(prev_text):
            i = next((j for j, (a, b) in enumerate(zip(text, prev_text)) if a != b), min(len(text), len(prev_text)))
            raise TemplateError(
                f"chat template is not prefix-stable: rendering the conversation with the new {role!r} message "
                f"changes earlier text (first difference at character {i}: {prev_text[i:i + 40]!r} became "
                f"{text[i:i + 40]!r})"
            )
        new_text = text[len(prev_text):]
        if new_text.startswith(self.added_tokens) or prev_text.endswith(self.added_tokens) or not prev_text:
            return self.encode(new_text)
        prev_ids, full = self.encode(prev_text), self.encode(text)
        n = len(prev_ids)
        if full[:n] != prev_ids:
            raise TemplateError(
                f"chat template is not prefix-stable at the token level: the new {role!r} message's text "
                f"{new_text[:40]!r} merges with the tokens before it"
            )
        return full[n:]


def _check_messages(messages: Any) -> list[Message]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if not isinstance(messages, (list, tuple)):
        raise TypeError(f"new_messages must be a list of chat messages, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
            raise ValueError(
                f"new_messages[{i}] must be a dict with role in {_ROLES} and a string content, got {m!r:.200}"
            )
        out.append(dict(m))
    return out


def _derive_seed(base: int, *parts: Any) -> int:
    return zlib.crc32(repr((base,) + parts).encode()) & 0x7FFFFFFF


class AgentLoopSession(PolicySession):
    """One episode's token-level state (see the module docstring for the rules).

    Invariants after every :meth:`act`: ``token_ids``, ``loss_mask``, ``logprobs`` and ``versions`` are aligned;
    ``loss_mask`` is 1 exactly on generated tokens, which carry the engine's log-prob and a version >= 0; every
    other token has log-prob 0.0 and version -1; ``len(token_ids) <= max_context_tokens``.
    ``stats`` counts ``requests``, ``resubmits`` and ``generate_s`` (seconds awaiting the engine).
    """

    def __init__(self, policy: "AgentLoopPolicy", meta: EpisodeMeta):
        self.policy, self.meta = policy, meta
        self.tools: list[dict] | None = None  # resolved at the first act(), after the env's reset
        self.cfg = policy.cfg
        self.chat = policy.chat
        self.messages: list[Message] = []
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.prompt_len = 0
        self.turns = 0
        self.stats: dict[str, float] = {"requests": 0, "resubmits": 0, "generate_s": 0.0}
        self._prev_text: str | None = None  # render(messages) after the last assistant turn
        self._inflight: str | None = None
        self._closed = False

    # -- token bookkeeping ----------------------------------------------------------------------------------------
    def _append_fixed(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def _append_generated(self, gen: Generation) -> None:
        n = len(gen.token_ids)
        if len(gen.logprobs) != n or len(gen.versions) != n:
            raise ValueError(
                f"engine returned misaligned generation: {n} tokens, {len(gen.logprobs)} logprobs, "
                f"{len(gen.versions)} versions"
            )
        if any(v < 0 for v in gen.versions):
            raise ValueError(f"engine returned a generated token without a version: {gen.versions!r:.200}")
        self.token_ids += gen.token_ids
        self.loss_mask += [1] * n
        self.logprobs += [float(x) for x in gen.logprobs]
        self.versions += [int(v) for v in gen.versions]

    def token_record(self) -> TokenRecord:
        return TokenRecord(
            token_ids=list(self.token_ids),
            loss_mask=list(self.loss_mask),
            logprobs=list(self.logprobs),
            versions=list(self.versions),
            prompt_len=self.prompt_len,
        )

    # -- the turn -------------------------------------------------------------------------------------------------
    async def act(self, new_messages: list[Message]) -> Action:
        if self._closed:
            raise RuntimeError(f"session {self.meta.trajectory_id} is closed")
        msgs = _check_messages(new_messages)
        if self.turns >= self.cfg.max_turns:
            return Action(text="", finish_reason="max_turns", context_exhausted=True)
        convo = self.messages + msgs
        if self._prev_text is None:
            if not msgs:
                raise ValueError("the first act() needs the env's opening messages")
            self.tools = self.policy.tools_for(self.meta)
            new_ids = self.chat.encode(self.chat.render(convo, add_generation_prompt=True, tools=self.tools))
        else:
            new_ids = self.chat.delta(self._prev_text, convo, self.tools)
        reserve = len(self.chat.closing_ids)
        room = self.policy.max_context_tokens - len(self.token_ids) - len(new_ids) - reserve
        if room < 1:
            return Action(text="", finish_reason="max_context", context_exhausted=True)
        self._append_fixed(new_ids)
        self.messages = convo
        if self.turns == 0:
            self.prompt_len = len(self.token_ids)

        gen = await self._generate(min(self.cfg.max_tokens_per_turn, room))
        self._append_generated(gen)
        k = self.chat.closing_overlap(gen.token_ids)
        self._append_fixed(self.chat.closing_ids[k:])
        text_ids = gen.token_ids[: len(gen.token_ids) - k]
        while text_ids and text_ids[-1] in self.chat.eos_ids:
            text_ids = text_ids[:-1]
        text = self.chat.decode(text_ids)
        self.messages = self.messages + [{"role": "assistant", "content": text}]
        rendered = self.chat.render(self.messages, add_generation_prompt=False, tools=self.tools)
        if not rendered.endswith(self.chat.closing_text):
            raise TemplateError(
                f"the chat template does not end this assistant message with {self.chat.closing_text!r} "
                f"(it ends with {rendered[-40:]!r})"
            )
        self._prev_text = rendered
        self.turns += 1
        return Action(
            text=text,
            token_ids=list(gen.token_ids),
            logprobs=list(gen.logprobs),
            versions=list(gen.versions),
            finish_reason=gen.finish_reason,
        )

    async def _generate(self, max_tokens: int) -> Generation:
        """Returns this turn's tokens; aborted requests are resubmitted with the tokens so far."""
        engine = self.policy.engine
        prompt = list(self.token_ids)
        out = Generation(token_ids=[], logprobs=[], versions=[], finish_reason="length")
        attempt = 0
        t0 = time.perf_counter()
        try:
            while True:
                remaining = max_tokens - len(out.token_ids)
                if remaining <= 0:
                    out.finish_reason = "length"
                    return out
                seed = None
                if self.cfg.seed is not None:
                    seed = _derive_seed(self.cfg.seed, self.meta.trajectory_id, self.turns, attempt)
                params = self.cfg.sampling_params(remaining, seed)
                rid = f"{self.meta.trajectory_id}-t{self.turns}-r{attempt}"
                self._inflight = rid
                self.stats["requests"] += 1
                gen = await engine.generate(
                    prompt + out.token_ids, params, request_id=rid, session_id=self.meta.trajectory_id
                )
                self._inflight = None
                out.token_ids += gen.token_ids
                out.logprobs += gen.logprobs
                out.versions += gen.versions
                out.finish_reason, out.stop_reason = gen.finish_reason, gen.stop_reason
                if gen.finish_reason != "abort" or self._closed:
                    return out
                attempt += 1
                self.stats["resubmits"] += 1
                if attempt > self.cfg.max_resubmits:
                    raise RuntimeError(
                        f"trajectory {self.meta.trajectory_id} turn {self.turns}: request aborted "
                        f"{attempt} times (max_resubmits={self.cfg.max_resubmits})"
                    )
        finally:
            self._inflight = None
            self.stats["generate_s"] += time.perf_counter() - t0

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
        self.chat = ChatTokens(tokenizer, self.cfg.chat_template_kwargs)
        self.tools = tools
        self.sessions_opened = 0
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
