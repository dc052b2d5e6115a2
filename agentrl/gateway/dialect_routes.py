"""The gateway's other model-facing dialects, each parsed into the internal chat request and served by the same
session path as chat completions (``Gateway._serve``)::

    POST /v1/messages                  Anthropic Messages (:mod:`~agentrl.gateway.anthropic`)
    POST /v1/responses                 OpenAI Responses (:mod:`~agentrl.gateway.responses_api`)
    POST /v1beta/models/<model>:generateContent, :streamGenerateContent?alt=sse (also /v1/models/...)
                                       Google's Gemini (:mod:`~agentrl.gateway.gemini`)

and each dialect's token count of a request, rendered as it would be served, with nothing sampled or recorded::

    POST /v1/messages/count_tokens     {"input_tokens": N}
    POST /v1/responses/input_tokens    {"object": "response.input_tokens", "input_tokens": N}
    POST /v1beta/models/<model>:countTokens   {"totalTokens": N} (``contents``, or a whole ``generateContentRequest``)

and the served model as each dialect's clients list and retrieve it (``GET /v1/models[/<id>]``,
``GET /v1beta/models[/<model>]``).

A mixin of :class:`agentrl.gateway.server.Gateway` (which supplies ``_auth``, ``_body``, ``_check_model``,
``_session``, ``_serve``, ``store``, ``model_name`` and ``response_log``): a handler only translates; sessions,
streaming, limits and errors are the server's.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agentrl.gateway import gemini
from agentrl.gateway.anthropic import message_body, parse_messages_request
from agentrl.gateway.choices import Completion
from agentrl.gateway.protocol import APIError, ChatRequest, bad, new_id
from agentrl.gateway.responses_api import new_response_id, parse_responses_request, response_body, response_skeleton
from agentrl.gateway.writers import GeminiWriter, MessagesWriter, ResponsesWriter


class DialectRoutes:
    store: Any
    response_log: Any
    model_name: str

    def _model_card(self, name: str) -> dict[str, Any]:
        """The served model in OpenAI's and Anthropic's forms at once (each client reads its own fields)."""
        return {"id": name, "object": "model", "created": 0, "owned_by": "agentrl", "type": "model",
                "display_name": name, "created_at": "1970-01-01T00:00:00Z", "max_model_len": self.store.max_model_len}

    async def models(self, request: web.Request) -> web.Response:
        self._auth(request)
        return web.json_response({"object": "list", "data": [self._model_card(self.model_name)], "has_more": False,
                                  "first_id": self.model_name, "last_id": self.model_name})

    async def model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/<id>`` (OpenAI's and Anthropic's retrieve): the served model, or an alias of it."""
        self._auth(request)
        name = request.match_info["model"]
        self._check_model(name)
        return web.json_response(self._model_card(name))

    async def _count(self, request: web.Request, req: ChatRequest, owner: str | None = None) -> int:
        """The prompt tokens ``req`` would take on its session now (a token-counting endpoint): no session is left
        behind by a count alone."""
        self._check_model(req.model)
        session = self._session(request)
        try:
            if owner is not None and owner != session.id:
                raise bad("previous_response_id", f"the previous response belongs to session {owner!r}, not to this "
                                                  f"request's session {session.id!r}", "wrong_session")
            return await session.count_tokens(req)
        finally:
            self.store.forget_unused(session.id)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages (:mod:`agentrl.gateway.anthropic`), served by the same session path as chat."""
        self._auth(request)
        req, notes = parse_messages_request(await self._body(request), self.store.max_tokens)
        return await self._serve(request, req, lambda: MessagesWriter(req.model), lambda d: message_body(d, req.model),
                                 notes)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's Responses (:mod:`agentrl.gateway.responses_api`), served by the same session path as chat."""
        self._auth(request)
        raw = await self._body(request)
        req, notes, owner = parse_responses_request(raw, self.store.max_tokens, self.response_log)
        rid = new_response_id()

        def body(done: Completion) -> dict[str, Any]:
            self.response_log.remember(rid, done, req.messages)
            return response_body(done, req, rid, raw)

        skeleton = response_skeleton(req, rid, raw)
        return await self._serve(request, req, lambda: ResponsesWriter(skeleton, body, rid), body, notes, owner=owner)

    async def count_messages(self, request: web.Request) -> web.Response:
        self._auth(request)
        req, _ = parse_messages_request(await self._body(request), self.store.max_tokens)
        return web.json_response({"input_tokens": await self._count(request, req)})

    async def count_responses(self, request: web.Request) -> web.Response:
        self._auth(request)
        raw = await self._body(request)
        if isinstance(raw, dict) and raw.get("model") is None:
            raw["model"] = self.model_name  # optional here in OpenAI's API: the served model
        req, _, owner = parse_responses_request(raw, self.store.max_tokens, self.response_log)
        return web.json_response({"object": "response.input_tokens",
                                  "input_tokens": await self._count(request, req, owner)})

    async def gemini_models(self, request: web.Request) -> web.Response:
        """``GET /v1beta/models`` and ``/v1beta/models/<model>`` in Gemini's form (``google-genai``'s list and get)."""
        self._auth(request)
        target = request.match_info.get("target")
        name = self.model_name if target is None else target.removeprefix("models/")
        self._check_model(name)
        card = {"name": f"models/{name}", "baseModelId": name, "version": "agentrl", "displayName": name,
                "inputTokenLimit": self.store.max_model_len, "outputTokenLimit": self.store.max_tokens,
                "supportedGenerationMethods": list(gemini.METHODS)}
        return web.json_response(card if target is not None else {"models": [card]})

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        """Google's Gemini ``generateContent`` / ``streamGenerateContent`` (:mod:`agentrl.gateway.gemini`), served by
        the same session path as chat."""
        self._auth(request)
        model, _, method = request.match_info["target"].rpartition(":")
        if method == "countTokens":
            body = await self._body(request)
            inner = body.get("generateContentRequest", body)
            if not isinstance(inner, dict):
                raise bad("generateContentRequest", "generateContentRequest must be an object")
            req, _ = gemini.parse_gemini_request(inner, model.removeprefix("models/"), False, self.store.max_tokens)
            return web.json_response({"totalTokens": await self._count(request, req)})
        if method not in gemini.METHODS:
            raise APIError(404, f"POST {request.path}: models/<model>:{method} is not served here (only "
                                f"{', '.join(gemini.METHODS)})", code="not_found")
        stream = method == "streamGenerateContent"
        if stream and request.query.get("alt") != "sse":
            raise bad("alt", "streamGenerateContent is served as server-sent events only: add ?alt=sse")
        req, notes = gemini.parse_gemini_request(await self._body(request), model.removeprefix("models/"), stream,
                                                 self.store.max_tokens)
        rid = new_id("gemini")
        return await self._serve(request, req, lambda: GeminiWriter(req.model),
                                 lambda d: gemini.gemini_body(d, req.model, rid), notes)
