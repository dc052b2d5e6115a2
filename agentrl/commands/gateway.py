"""``agentrl gateway``: an OpenAI-compatible server in front of a vLLM engine that records every token per session.

    agentrl gateway                                   # the tiny CPU model on http://127.0.0.1:8000
    agentrl gateway --model DIR --port 8000 --out sessions.jsonl
    agentrl gateway --host 0.0.0.0 --api-key "$KEY"   # reachable from other machines: a key is required
    agentrl gateway --config gateway.yaml --set gateway.max_n=4
    agentrl gateway --host 0.0.0.0 --api-key "$KEY" --allowed-host gw.example   # only Host: gw.example[:port]

Point any OpenAI client at ``http://127.0.0.1:8000/s/<session>/v1`` (or send ``X-Agentrl-Session``, or use
``<api_key>:<session>`` as the key). End a session with ``POST /v1/sessions/<session>/end {"reward": R}``: its
trajectory (every sampled token with its log-prob and version, in segments) is appended to ``--out`` (default
``gateway-sessions.jsonl``). Sessions idle for ``session_idle_s`` and those live at shutdown are written too
(``truncated``, reward 0). Exit status 0 on Ctrl-C/SIGTERM, 1 when the engine died (``/health`` answers 503 and
requests ``engine_dead`` from then on, until the server has stopped), 2 on a config error.

Requests must name an allowed host (``--allowed-host``, default: the loopback names and ``--host``; any name on a
wildcard bind), must not come from a browser page on another origin (``gateway.allowed_origins``), and POST JSON
(``Content-Type: application/json``): see README's Security section before exposing the server.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from agentrl.gateway.config import GatewayConfig


@dataclass
class GatewayRunConfig:
    """``agentrl gateway``'s config file: ``model`` (a directory; None or ``tiny``: the tiny CPU model), ``engine``
    (:class:`agentrl.inference.EngineConfig` fields) and ``gateway`` (:class:`GatewayConfig`)."""

    model: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gateway",
        help="serve an engine behind an OpenAI-compatible API that records every token per session",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="a YAML GatewayRunConfig")
    p.add_argument("--model", help="model directory (default: the tiny model, built if missing)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=int, help="port (default 8000; 0: a free one)")
    p.add_argument("--api-key", help="the API key clients must send (or set AGENTRL_GATEWAY_API_KEY)")
    p.add_argument("--served-model-name", help="the model name clients ask for (default: the directory's name)")
    p.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a host name clients reach the server by, beyond the loopback names and --host "
                        "(repeatable; '*' accepts any)")
    p.add_argument("--out", help="JSONL file the ended sessions' trajectories are appended to")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.set_defaults(func=_main)


def load_config(args: argparse.Namespace) -> GatewayRunConfig:
    import json
    import os

    from agentrl.config import apply_overrides, from_dict, load

    overrides = list(args.set)
    key = args.api_key or os.environ.get("AGENTRL_GATEWAY_API_KEY")
    for value, name in ((args.model, "model"), (args.host, "gateway.host"), (args.port, "gateway.port"),
                        (key, "gateway.api_key"), (args.served_model_name, "gateway.model_name"),
                        (args.out, "gateway.out")):
        if value is not None:
            overrides.append(f"{name}={json.dumps(value)}")
    if args.config:
        cfg = load(GatewayRunConfig, args.config, overrides)
    else:
        cfg = from_dict(GatewayRunConfig, apply_overrides({}, overrides), "<command line>")
    if getattr(args, "allowed_host", None):
        from agentrl.netguard import LOOPBACK_NAMES, default_hosts

        base = cfg.gateway.allowed_hosts or default_hosts(cfg.gateway.host) or list(LOOPBACK_NAMES)
        cfg.gateway.allowed_hosts = [*base, *args.allowed_host]
    return cfg


def _main(args: argparse.Namespace) -> int:
    import asyncio

    from agentrl.config import ConfigError

    cfg = load_config(args)
    try:
        cfg.gateway.validate()
    except ValueError as e:
        raise ConfigError(f"gateway: {e}") from None
    return asyncio.run(serve(cfg))


def context_note(model_dir: str, max_model_len: int) -> str | None:
    """A line for the operator when the model takes longer prompts than the engine was started for (the engine's
    ``max_model_len`` defaults to 2,048 whatever the model; a harness's prompt is often 15-35k tokens)."""
    import json
    import os

    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            positions = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(positions, int) or positions <= max_model_len:
        return None
    return (f"agentrl gateway: prompts are limited to max_model_len={max_model_len} tokens; the model takes "
            f"{positions} (--set engine.max_model_len={positions})")


async def serve(cfg: GatewayRunConfig, stop: "asyncio.Event | None" = None, *, engine: Any = None) -> int:
    """Starts the engine (``engine``: serve this one instead; it is not closed here) and the gateway, and serves
    until ``stop`` is set (or SIGINT/SIGTERM: 0) or the engine dies (1); returns the exit status."""
    import asyncio
    import signal
    import sys

    from agentrl import gcheap
    from agentrl.chat import load_tokenizer
    from agentrl.config import from_dict
    from agentrl.gateway.server import Gateway
    from agentrl.inference import EngineConfig, make_engine
    from agentrl.inference.base import EngineDead, unless_dead

    if not cfg.gateway.out:
        cfg.gateway.out = "gateway-sessions.jsonl"  # a command-line server keeps every ended session somewhere
    model = cfg.model
    if model in (None, "tiny"):
        from agentrl.models import ensure_tiny_model

        model = str(ensure_tiny_model())
        cfg.gateway.model_name = cfg.gateway.model_name or "tiny"
    tokenizer = load_tokenizer(model)
    own = engine is None
    if own:
        engine = await asyncio.to_thread(make_engine, from_dict(EngineConfig, {"model": model, **cfg.engine}, "engine"))
    signals: list[int] = []
    status = 0
    if stop is None:  # the command line: Ctrl-C / SIGTERM end the server (sessions live then are written)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
                signals.append(sig)
            except (NotImplementedError, RuntimeError):
                pass
    try:
        async with Gateway(engine, tokenizer, cfg.gateway) as gw:
            print(f"agentrl gateway: serving {gw.model_name!r} at {gw.url}/v1 (sessions: {gw.url}/s/<id>/v1)",
                  file=sys.stderr, flush=True)
            note = context_note(model, gw.store.max_model_len)
            if note:
                print(note, file=sys.stderr, flush=True)
            try:
                with gcheap.settled():
                    await unless_dead(engine, stop.wait())
            except EngineDead as e:  # as vLLM's own server does: exit, so that a supervisor starts a new one
                print(f"agentrl gateway: stopping, the engine is dead: {e}; live sessions go to {cfg.gateway.out} "
                      f"(truncated); exit status 1", file=sys.stderr, flush=True)
                status = 1
    finally:
        for sig in signals:
            asyncio.get_running_loop().remove_signal_handler(sig)
        if own:
            await engine.close()
    return status
