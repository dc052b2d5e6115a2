"""The streamed answer to one request: the session samples, the dialect's writer sends each delta as it comes.

Flow: the request's coroutine (``run(live)``, a session's ``chat`` or ``complete`` given a
:class:`~agentrl.gateway.live.LiveRequest`) runs as a task; the live request puts ``("start", prompt_tokens)`` and
then ``(choice, kind, text)`` deltas in an inbox, and the task's end puts ``None``. Engine steps reach the inbox
before the task's result (:meth:`~agentrl.inference.base.InferenceEngine.generate_streaming`), so the last deltas
precede the end. This loop writes what the inbox holds (all of it per write), an SSE keep-alive when nothing came
for ``keepalive_s``, and once the task is done, the rest of the final reading and the writer's closing frames.

Errors: the response starts (HTTP 200, SSE headers) only when sampling starts, or after ``keepalive_s`` without it,
so a request the gateway refuses (bad field, context too long, session ended) gets a plain error response with its
status; a later failure is the dialect's error event, counted as the plain response would have been
(``errors[code]``, the gateway's ``gateway/errors/<code>``; ``server_error`` for an engine failure), and the session
records nothing of it. A client that hangs up cancels its request: the engine request is aborted, the session
records nothing of it (it is as it was before), and ``on_hang_up`` counts it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Awaitable, Callable, Protocol

from aiohttp import web

from agentrl.gateway.choices import Completion
from agentrl.gateway.live import LiveRequest
from agentrl.gateway.protocol import APIError, engine_dead
from agentrl.inference.base import cancel_when

log = logging.getLogger("agentrl.gateway")


class Writer(Protocol):
    keepalive: bytes

    def start(self, prompt_tokens: int) -> list[bytes]: ...

    def delta(self, i: int, kind: str, text: str) -> list[bytes]: ...

    def finish(self, done: Completion) -> list[bytes]: ...

    def error(self, e: APIError) -> bytes: ...


async def stream_live(request: web.Request, run: Callable[[LiveRequest], Awaitable[Completion]], live: LiveRequest,
                      writer: Writer, *, keepalive_s: float, on_hang_up: Callable[[web.Request], None],
                      errors: Counter[str], headers: dict[str, str] | None = None,
                      dead: Callable[[], str | None] = lambda: None) -> web.StreamResponse:
    """Answers ``request`` with the stream of ``run(live)`` (see the module docstring); a failure after the response
    started is counted in ``errors[code]``, as the server counts a plain error response (``engine_dead`` when
    ``dead()`` names why the engine can generate no more)."""
    inbox = _Inbox()
    live.sink = inbox.put
    task = asyncio.ensure_future(run(live))
    task.add_done_callback(lambda t: inbox.put(None))
    try:
        await inbox.wait(keepalive_s)
    except BaseException:
        task.cancel()
        raise
    if inbox.items == [None]:  # failed (or done) before sampling started: a plain response
        task.result()  # raises the request's error
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       **(headers or {})})
    try:
        await resp.prepare(request)
        while True:
            if not await inbox.wait(keepalive_s):
                await resp.write(writer.keepalive)
                continue
            pending = inbox.take()
            ended = None in pending
            frames: list[bytes] = []
            for item in pending:
                if item is None:
                    break
                frames += writer.start(item[1]) if item[0] == "start" else writer.delta(*item)
            if frames:
                await resp.write(b"".join(frames))
            if ended:
                break
        await resp.write(b"".join(_closing(task, live, writer, errors, dead)))
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError) as e:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if isinstance(e, asyncio.CancelledError):
            raise
        on_hang_up(request)
    return resp


class _Inbox:
    """What the live request and the request's end put for the stream's writer, and the writer's wait for it: a
    future and a timer per wait (``asyncio.wait_for`` on a queue made a task per wait, once per engine step)."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Any) -> None:
        self.items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout_s: float) -> bool:
        """True once something was put (at once if something is waiting), False after ``timeout_s`` without."""
        if not self.items:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = loop.call_later(timeout_s, lambda: waiter.done() or waiter.set_result(None))
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return bool(self.items)

    def take(self) -> list[Any]:
        items, self.items = self.items, []
        return items


def _closing(task: asyncio.Future, live: LiveRequest, writer: Writer, errors: Counter[str],
             dead: Callable[[], str | None]) -> list[bytes]:
    """The frames after the last delta: the rest of the final reading and the writer's end, or an error event."""
    try:
        done: Completion = task.result()
    except APIError as e:
        errors[e.code or e.type] += 1
        return [writer.error(e)]
    except Exception as e:
        if why := dead():
            errors["engine_dead"] += 1
            return [writer.error(engine_dead(why))]
        log.exception("gateway: streamed request failed")
        errors["server_error"] += 1
        return [writer.error(APIError(500, f"internal error: {e!r:.500}", "server_error"))]
    frames: list[bytes] = []
    for i, kind, text in live.finish(done):
        frames += writer.delta(i, kind, text)
    return frames + writer.finish(done)


HANG_UP_POLL_S = 0.5  # how often a whole (not streamed) answer's connection is looked at while it is sampled


async def until_hung_up(request: web.Request, work: Awaitable[Completion]) -> Completion:
    """Awaits ``work``, a whole (not streamed) answer's sampling. A client that hangs up meanwhile (a harness's
    timeout) cancels it, as a stream's does and as vLLM's own server does: the engine request is aborted, the session
    records nothing of it, and ``ConnectionResetError`` is raised (counted as a hang-up). aiohttp does not cancel a
    handler whose client left, and tells no one, so the connection is looked at every :data:`HANG_UP_POLL_S`:
    without it, a request with no ``max_tokens`` on a long-context model samples for minutes for nobody."""

    def gone() -> BaseException | None:
        transport = request.transport
        return ConnectionResetError("the client hung up") if transport is None or transport.is_closing() else None

    return await cancel_when(work, gone, HANG_UP_POLL_S)
