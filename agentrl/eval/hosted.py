"""Hosted models as policies: an API that speaks OpenAI chat completions (a hosted model, a proxy, vLLM's own
``vllm serve``), OpenAI Responses or Anthropic Messages (:mod:`agentrl.eval.dialects`), acting in agentrl's envs, for
``agentrl eval`` (``policy.kind``: ``openai-chat``, ``openai-responses``, ``anthropic-messages``, ``google-gemini``).

Per episode, :class:`HostedChatSession` keeps the conversation as the API's messages: the env's messages as they
come (a ``tool`` message answers the previous turn's calls in order and gets their ``tool_call_id``), the model's
replies with their ``tool_calls``. The env's tool schemas (``reset``'s ``info["tools"]``) go to the API as its
native ``tools``; the model's native tool calls reach the env in agentrl's text format
(:func:`agentrl.tools.format_tool_call`), after the reply's content, and as ``Action.tool_calls``.

What a hosted API cannot give: token ids, log-probs and versions. Trajectories are text-level (``token_ids``
empty, ``info["text_level"]`` true): good for evaluation reports, not for training.

Failures: 429 and 5xx answers and lost connections are retried with exponential backoff (``retries`` times), at
least as late as the answer's ``Retry-After`` asks (up to a minute); a
401/403 (bad key), a 404 (unknown model or path) or another 4xx fails at once with the server's message. A run
whose requests used more than ``max_total_tokens`` (prompt + completion, as the API reports them) refuses every
later request with :class:`SpendLimit`. An episode that fails ends as an error (the eval's records say which and
why); the eval run itself is resumable as any other.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from agentrl.core import Message
from agentrl.eval import dialects
from agentrl.eval.dialects import Reply
from agentrl.policy import Action, EpisodeMeta, Policy, PolicySession, TokenRecord
from agentrl.tools import JSON_ERRORS, format_tool_call


class HostedAPIError(RuntimeError):
    """The API refused a request, or kept failing after every retry."""


class SpendLimit(HostedAPIError):
    """The run's token budget (``max_total_tokens``) is spent."""


@dataclass
class HostedConfig:
    """``base_url``: the API root (``.../v1``); ``model``: the model name it serves; ``dialect``: ``chat`` (OpenAI
    chat completions), ``responses`` (OpenAI Responses), ``messages`` (Anthropic Messages) or ``gemini`` (Google's
    Gemini); ``api_key_env``: the environment
    variable holding the key (unset or empty: no key sent); ``temperature``, ``max_tokens`` per reply;
    ``concurrency``: requests in flight at once; ``retries`` on 429/5xx/lost connections, from ``backoff_s``
    doubling; ``timeout_s`` per request; ``max_total_tokens``: the run's token budget (None: none)."""

    base_url: str
    model: str
    dialect: str = "chat"
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 512
    concurrency: int = 8
    retries: int = 4
    backoff_s: float = 1.0
    timeout_s: float = 120.0
    max_total_tokens: int | None = None

    def validate(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if not self.model:
            raise ValueError("model must name the model the API serves")
        if self.dialect not in dialects.DIALECTS:
            raise ValueError(f"dialect must be one of {', '.join(dialects.DIALECTS)}, got {self.dialect!r}")
        for name in ("max_tokens", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ValueError("retries and backoff_s must be >= 0 and timeout_s > 0")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise ValueError(f"max_total_tokens must be >= 1 or null, got {self.max_total_tokens}")


class HostedChatPolicy(Policy):
    """See the module docstring. ``usage`` totals what the API reported (``prompt_tokens``, ``completion_tokens``,
    ``requests``, ``retries``)."""

    def __init__(self, cfg: HostedConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0, "retries": 0}
        self._sem: asyncio.Semaphore | None = None
        self._session: Any = None

    @property
    def version(self) -> int:
        return 0

    def session(self, meta: EpisodeMeta) -> "HostedChatSession":
        return HostedChatSession(self, meta)

    def spent(self) -> int:
        return self.usage["prompt_tokens"] + self.usage["completion_tokens"]

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def complete(self, path: str, body: dict[str, Any]) -> Reply:
        """POSTs ``body`` to ``{base_url}{path}`` with retries (module docstring); returns the parsed reply."""
        import aiohttp

        cfg = self.cfg
        if cfg.max_total_tokens is not None and self.spent() >= cfg.max_total_tokens:
            raise SpendLimit(f"the run's token budget is spent ({self.spent()} of max_total_tokens="
                             f"{cfg.max_total_tokens})")
        if self._sem is None:
            self._sem = asyncio.Semaphore(cfg.concurrency)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=cfg.timeout_s))
        hdrs = dialects.headers(cfg.dialect, os.environ.get(cfg.api_key_env, ""))
        url = cfg.base_url.rstrip("/") + path
        last, asked = "", 0.0
        async with self._sem:
            for attempt in range(cfg.retries + 1):
                if attempt:
                    self.usage["retries"] += 1
                    await asyncio.sleep(max(asked, cfg.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random() / 2)))
                asked = 0.0
                try:
                    async with self._session.post(url, json=body, headers=hdrs) as r:
                        text = await r.text()
                        status = r.status
                        waits = r.headers
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    last = f"{type(e).__name__}: {e}"
                    continue
                if status == 429 or status >= 500:
                    last = f"HTTP {status}: {text[:300]}"
                    asked = retry_after(waits)
                    continue
                if status != 200:
                    raise HostedAPIError(f"{url}: HTTP {status}{_hint(status)}: {text[:500]}")
                try:
                    rep = dialects.reply(cfg.dialect, json.loads(text))
                except JSON_ERRORS as e:
                    raise HostedAPIError(f"{url}: {e}: {text[:300]!r}") from None
                self.usage["requests"] += 1
                self.usage["prompt_tokens"] += rep.prompt_tokens
                self.usage["completion_tokens"] += rep.completion_tokens
                return rep
        raise HostedAPIError(f"{url}: gave up after {cfg.retries + 1} attempts (last: {last})")


MAX_RETRY_AFTER_S = 60.0


def retry_after(headers: Any) -> float:
    """Seconds a 429/5xx answer asks the client to wait: ``retry-after-ms`` (OpenAI's), else ``Retry-After`` in
    seconds or as an HTTP date; 0 when it asks nothing readable. At most :data:`MAX_RETRY_AFTER_S`, as OpenAI's own
    client bounds it: a server asking for longer is better retried later than waited on with a request held.
    ``headers``: case-insensitive (aiohttp's)."""
    def number(text: str | None, scale: float = 1.0) -> float | None:
        try:
            value = float(text) * scale if text else math.nan
        except ValueError:
            return None
        return value if math.isfinite(value) else None

    wait = number(headers.get("retry-after-ms"), 1e-3)
    if wait is None:
        text = (headers.get("retry-after") or "").strip()
        wait = number(text)
        if wait is None and text:
            try:
                wait = email.utils.parsedate_to_datetime(text).timestamp() - time.time()
            except (ValueError, TypeError, OverflowError):
                wait = None
    return min(max(wait or 0.0, 0.0), MAX_RETRY_AFTER_S)


def _hint(status: int) -> str:
    return {401: " (bad or missing API key: set the variable named by api_key_env)",
            403: " (the key may not use this model)", 404: " (unknown model or wrong base_url)"}.get(status, "")


class HostedChatSession(PolicySession):
    """One episode's conversation with the API (see the module docstring)."""

    def __init__(self, policy: HostedChatPolicy, meta: EpisodeMeta) -> None:
        self.policy, self.meta = policy, meta
        self.messages: list[dict[str, Any]] = []
        self._calls: list[dict[str, Any]] = []  # the last reply's tool calls, answered by the next tool messages
        self.turns = 0

    async def act(self, new_messages: list[Message]) -> Action:
        answered = 0
        for m in new_messages:
            m = dict(m)
            if m.get("role") == "tool":
                if answered < len(self._calls):
                    m.setdefault("tool_call_id", self._calls[answered]["id"])
                    answered += 1
                else:  # a tool message that answers no call: the API would refuse it
                    m = {"role": "user", "content": m.get("content", "")}
            self.messages.append(m)
        cfg = self.policy.cfg
        path, body = dialects.request(cfg.dialect, cfg.model, self.messages, getattr(self.meta, "tools", None),
                                      cfg.temperature, cfg.max_tokens)
        rep = await self.policy.complete(path, body)
        calls = rep.tool_calls
        for i, c in enumerate(calls):
            c.setdefault("id", f"call_{self.meta.trajectory_id}_{self.turns}_{i}")
            c["id"] = c["id"] or f"call_{self.meta.trajectory_id}_{self.turns}_{i}"
            c.setdefault("type", "function")
        self._calls = calls
        self.messages.append({"role": "assistant", "content": rep.content, **({"tool_calls": calls} if calls else {})})
        self.turns += 1
        text = "\n".join([rep.content.strip()] * bool(rep.content.strip()) + [
            format_tool_call(c["function"].get("name", ""), dialects.json_object(c["function"].get("arguments"))) for c in calls])
        return Action(text=text, finish_reason=rep.finish_reason, tool_calls=calls)

    def token_record(self) -> TokenRecord:
        # a hosted API gives no token ids: the trajectory is text-level, and says so
        return TokenRecord(info={"text_level": True, "hosted/requests": self.turns})

    async def aclose(self) -> None:
        pass
