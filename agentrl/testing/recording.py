"""An engine wrapper for tests that check a capture against what the engine really returned.

:class:`RecordingEngine` forwards every call to the wrapped :class:`~agentrl.inference.base.InferenceEngine` and
keeps ``record``: ``(prompt_ids, Generation)`` of every generation it returned, in order, with the session each was
for in ``sessions`` (same index). ``script[session_id]``: outputs (token ids) returned in turn instead of sampling,
for that session's next requests, told token by token as the engine streams (a tiny model never writes a
well-formed tool call; a scripted one makes a harness run its tool). A scripted output carries log-prob -1.0 (it
was not sampled) and the engine's current version. ``break_stream[session_id]``: the session's next streamed
request tells these ids and then raises :class:`EngineFault`, as an engine that dies mid-completion: nothing of it
is returned or recorded (how a harness copes with a stream that fails after it started); ``broken`` keeps
``(prompt_ids, session_id)`` of each request so failed.
"""

from __future__ import annotations

from typing import Any

from agentrl.inference.base import Generation, InferenceEngine


class EngineFault(RuntimeError):
    """The failure ``break_stream`` injects."""


class RecordingEngine(InferenceEngine):
    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.record: list[tuple[list[int], Generation]] = []
        self.sessions: list[str | None] = []
        self.script: dict[str, list[list[int]]] = {}
        self.break_stream: dict[str, list[int]] = {}
        self.broken: list[tuple[list[int], str]] = []
        self.max_model_len = getattr(engine, "max_model_len", None)
        self.model_path = getattr(engine, "model_path", None)

    def for_session(self, session_id: str) -> list[tuple[list[int], Generation]]:
        """The recorded generations of one session, in order."""
        return [r for r, s in zip(self.record, self.sessions) if s == session_id]

    async def generate(self, prompt_ids, params, *, request_id, session_id=None):
        gen = self._scripted(session_id, lambda ids: None)
        if gen is None:  # the engine's own whole-generation path, not its streaming one
            gen = await self.engine.generate(prompt_ids, params, request_id=request_id, session_id=session_id)
        return self._keep(prompt_ids, gen, session_id)

    async def generate_streaming(self, prompt_ids, params, *, request_id, session_id=None, on_tokens):
        if session_id in self.break_stream:
            self.broken.append((list(prompt_ids), session_id))
            for t in self.break_stream.pop(session_id):
                on_tokens([t])
            raise EngineFault(f"injected: the engine failed mid-completion of {request_id}")
        gen = self._scripted(session_id, on_tokens)
        if gen is None:
            gen = await self.engine.generate_streaming(prompt_ids, params, request_id=request_id,
                                                       session_id=session_id, on_tokens=on_tokens)
        return self._keep(prompt_ids, gen, session_id)

    def _scripted(self, session_id, on_tokens) -> Generation | None:
        if session_id is None or not self.script.get(session_id):
            return None
        ids = self.script[session_id].pop(0)
        for t in ids:
            on_tokens([t])
        return Generation(list(ids), [-1.0] * len(ids), [self.engine.version] * len(ids), "stop")

    def _keep(self, prompt_ids, gen: Generation, session_id) -> Generation:
        self.record.append((list(prompt_ids), gen))
        self.sessions.append(session_id)
        return gen

    async def update_weights(self, state_dict, version):
        return await self.engine.update_weights(state_dict, version)

    @property
    def version(self):
        return self.engine.version

    async def abort(self, request_id):
        await self.engine.abort(request_id)
