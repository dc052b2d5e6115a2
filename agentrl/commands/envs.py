"""``agentrl envs list`` and ``agentrl envs check ID...|--all``.

``check`` runs, per env: ``agentrl.make``, a check that its observations and actions are text (a numeric gymnasium
env such as CartPole fails there, with its spaces named), gymnasium's ``check_env`` on the unwrapped env (any warning it raises
counts as a failure), a seeded episode through the registered wrappers whose actions alternate between
``env.action_space.sample()`` and the env's scripted solver (random text alone when it has none; every returned
value is checked against the spaces and types), the async path (``areset`` must give the same opening as
``reset`` for the same seed, then one ``astep``), and, if the env has a scripted solver, one solver episode whose
return is reported. It prints one ``PASS``/``FAIL`` line per env and returns 1 if any env failed. With ``--all``, an
env whose constructor needs arguments that nobody gave (a server's address) is reported ``SKIP`` with what it needs (a
named one ``FAIL``, with the command line that gives them). Arguments of the
form ``key=value`` are env kwargs given to every env checked (values read as YAML: ``size=100`` is an int,
``tools=[a, b]`` a list, anything else a string), e.g. ``agentrl envs check reasoning_gym/leg_counting max_animals=3``.

``serve ID [key=value ...]`` serves the env as an OpenEnv environment server (openenv-core's own server: HTTP and
the ``/ws`` WebSocket session; see :mod:`agentrl.envs.bridges.openenv_server`), on loopback unless ``--host`` says
otherwise; requests from other sites' web pages and by other host names are refused unless ``--allowed-origin`` and
``--allowed-host`` name them.

``list`` prints the registered ids, then one ``<namespace>/<name>`` line per env family (ids made on first use;
``--family NAMESPACE`` lists the family's names).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import warnings
from typing import Any

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("envs", help="list and check the registered environments")
    sub = parser.add_subparsers(dest="envs_command", metavar="ACTION")
    parser.set_defaults(func=lambda args: _usage(parser))

    p_list = sub.add_parser("list", help="print the registered env ids with one-line descriptions")
    p_list.add_argument("--namespace", help="only ids of this namespace (e.g. agentrl)")
    p_list.add_argument("--family", help="list the names of this env family (e.g. reasoning_gym; imports its library)")
    p_list.set_defaults(func=_list)

    p_check = sub.add_parser("check", help="run gymnasium's checker and a seeded random-action episode per env")
    p_check.add_argument("ids", nargs="*", metavar="ID|KEY=VALUE",
                         help="env ids to check, and env kwargs (key=value, value read as YAML) given to each")
    p_check.add_argument("--all", action="store_true", help="check every registered env")
    p_check.add_argument("--seed", type=int, default=0, help="seed of the episodes (default 0)")
    p_check.add_argument("--max-steps", type=int, default=50, help="step cap of the random episode (default 50)")
    p_check.set_defaults(func=_check)

    p_serve = sub.add_parser("serve", help="serve an env as an OpenEnv server (HTTP + WebSocket sessions at /ws)")
    p_serve.add_argument("id", metavar="ID", help="env id to serve")
    p_serve.add_argument("kwargs", nargs="*", metavar="KEY=VALUE", help="env kwargs (value read as YAML)")
    p_serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p_serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p_serve.add_argument("--max-sessions", type=int, default=64, help="concurrent WebSocket sessions (default 64)")
    p_serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                         help="a host name clients reach the server by, beyond the loopback names and --host "
                              "(repeatable; '*' accepts any)")
    p_serve.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                         help="a web page origin allowed to use the server, e.g. http://localhost:3000 (repeatable; "
                              "none by default)")
    p_serve.set_defaults(func=_serve)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _list(args: argparse.Namespace) -> int:
    from agentrl.registration import RegistrationError, description, families, family_names, registered_ids

    if args.family:
        try:
            names = family_names(args.family)
        except RegistrationError as e:
            print(f"agentrl envs list: {e}")
            return 2
        for name in names:
            print(f"{args.family}/{name}")
        return 0
    ids = registered_ids(args.namespace)
    fams = [f for f in families() if args.namespace in (None, f.namespace)]
    if not ids and not fams:
        print("no environments registered" + (f" in namespace {args.namespace!r}" if args.namespace else ""))
        return 0
    rows = [(env_id, description(env_id)) for env_id in ids]
    rows += [(f"{f.namespace}/<name>", f"{f.description} (names: agentrl envs list --family {f.namespace})")
             for f in fams]
    width = max(len(r[0]) for r in rows)
    for env_id, text in rows:
        print(f"{env_id:<{width}}  {text}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        env_kwargs = parse_env_kwargs(args.kwargs)
        if not 1 <= args.max_sessions <= 4096:
            raise ValueError(f"--max-sessions must be in [1, 4096], got {args.max_sessions}")
        from agentrl.envs.bridges.openenv_server import serve
    except (ValueError, ImportError) as e:
        print(f"agentrl envs serve: {e}")
        return 2
    try:
        serve(args.id, env_kwargs, host=args.host, port=args.port, max_sessions=args.max_sessions,
              allowed_hosts=args.allowed_host, allowed_origins=args.allowed_origin)
    except Exception as e:  # a bad id or kwarg: one line, not a traceback
        print(f"agentrl envs serve: {type(e).__name__}: {e}")
        return 1
    return 0


def parse_env_kwargs(items: list[str]) -> dict[str, Any]:
    """Reads ``key=value`` arguments as env kwargs (each value as YAML; a value YAML cannot read stays a string).
    Raises ``ValueError`` naming an argument whose key is not an identifier."""
    import yaml

    from agentrl.config import load_yaml

    out: dict[str, Any] = {}
    for item in items:
        key, _, text = item.partition("=")
        if not key.isidentifier():
            raise ValueError(f"env kwarg {item!r}: the key must be a Python identifier (key=value)")
        try:
            out[key] = load_yaml(text) if text.strip() else ""
        except yaml.YAMLError:
            out[key] = text
    return out


def _check(args: argparse.Namespace) -> int:
    from agentrl.registration import registered_ids

    if args.all and any("=" not in a for a in args.ids):
        print("agentrl envs check: give env ids or --all, not both")
        return 2
    try:
        env_kwargs = parse_env_kwargs([a for a in args.ids if "=" in a])
    except ValueError as e:
        print(f"agentrl envs check: {e}")
        return 2
    ids = registered_ids() if args.all else [a for a in args.ids if "=" not in a]
    if not ids:
        print("agentrl envs check: give one or more env ids, or --all")
        return 2
    width = max(len(i) for i in ids)
    failed = skipped = 0
    for env_id in ids:
        needs = _required_kwargs(env_id, env_kwargs)
        if needs and args.all:  # --all cannot invent a server address: say so instead of failing the env
            skipped += 1
            print(f"SKIP  {env_id:<{width}}  needs env kwargs {', '.join(f'{k}=...' for k in needs)}", flush=True)
            continue
        if needs:  # named, but not makeable as given: what it needs and how to give it, not Python's TypeError
            failed += 1
            print(f"FAIL  {env_id:<{width}}  needs env kwargs {', '.join(f'{k}=...' for k in needs)}: agentrl envs "
                  f"check {env_id} {' '.join(f'{k}=VALUE' for k in needs)}", flush=True)
            continue
        ok, detail = check_env_id(env_id, seed=args.seed, max_steps=args.max_steps, env_kwargs=env_kwargs)
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {env_id:<{width}}  {detail}", flush=True)
    print(f"{len(ids) - failed - skipped} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0


def _required_kwargs(env_id: str, given: dict[str, Any]) -> list[str]:
    """The constructor arguments of ``env_id`` that have no default and are neither registered nor ``given``."""
    import importlib
    import inspect

    from agentrl.registration import spec

    try:
        s = spec(env_id)
        ep = s.entry_point
        if isinstance(ep, str):
            module, _, attr = ep.partition(":")
            ep = getattr(importlib.import_module(module), attr)
        params = inspect.signature(ep).parameters.values()
    except Exception:  # unknown, unloadable or opaque: let the check itself report it
        return []
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in s.kwargs and p.name not in given]


class _CheckFailed(Exception):
    pass


def check_env_id(env_id: str, *, seed: int = 0, max_steps: int = 50,
                 env_kwargs: dict[str, Any] | None = None) -> tuple[bool, str]:
    """Checks one registered env, made with ``env_kwargs``; returns ``(ok, detail)``. Never raises for a broken
    env: the exception becomes the detail, prefixed by the stage that failed."""
    import agentrl

    stage = "make"
    notes: list[str] = []
    env = None
    try:
        env = agentrl.make(env_id, **(env_kwargs or {}))
        stage = "spaces"
        _text_spaces(env, env_id)
        stage = "check_env"
        _gymnasium_check(env.unwrapped)
        notes.append("check_env ok")
        stage = "random episode"
        notes.append(_random_episode(env, seed, max_steps))
        solve = getattr(env.unwrapped, "solve", None)
        if callable(solve):
            stage = "solver episode"
            from agentrl.envs.utils import play_episode

            result = play_episode(env, solve, seed=seed, max_steps=max_steps)
            notes.append(f"solver: return {result.total_reward:g} in {_steps(result.steps)}")
        stage = "async"  # last: it ends with aclose()
        sync_obs, _ = env.reset(seed=seed)  # outside the loop: envs with native async may refuse sync calls there
        asyncio.run(_async_check(env, seed, sync_obs))
        notes.append("async ok")
        return True, "; ".join(notes)
    except Exception as e:  # the command reports every failure, whatever raised it
        text = _ANSI_RE.sub("", str(e)).strip().splitlines()
        kind = "" if isinstance(e, _CheckFailed) else f"{type(e).__name__}: "
        return False, f"{stage}: {kind}{text[0] if text else ''}"
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:
                pass


def _text_spaces(env: Any, env_id: str) -> None:
    """A gymnasium env whose observations or actions are not text (CartPole's Box, FrozenLake's Discrete) failed
    later with an unrelated TypeError; say what is wrong."""
    from gymnasium import spaces

    from agentrl.core import MessagesSpace, TextSpace

    obs, act = env.observation_space, env.action_space
    if not isinstance(obs, (MessagesSpace, TextSpace, spaces.Text)) or not isinstance(act, (TextSpace, spaces.Text)):
        fix = (f"make it as 'gymnasium/{env_id}', which puts both into text" if "/" not in env_id else
               "wrap this env so that both are text")
        raise _CheckFailed(f"observations {obs}, actions {act}: an agentrl env takes text actions and gives text or "
                           f"chat-message observations; {fix} (README, 'Environments')")


def _gymnasium_check(env: Any) -> None:
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    if caught:
        raise _CheckFailed("; ".join(_ANSI_RE.sub("", str(w.message)).replace("WARN: ", "").strip() for w in caught))


def _check_step(env: Any, step: int, result: Any) -> tuple[float, bool, bool]:
    if not isinstance(result, tuple) or len(result) != 5:
        raise _CheckFailed(f"step {step}: step() must return a 5-tuple, got {type(result).__name__}")
    obs, reward, terminated, truncated, info = result
    if obs not in env.observation_space:
        raise _CheckFailed(f"step {step}: observation not in the observation space: {obs!r:.80}")
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise _CheckFailed(f"step {step}: reward {reward!r} is not a number") from None
    if not math.isfinite(reward):
        raise _CheckFailed(f"step {step}: reward {reward!r} is not finite")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            raise _CheckFailed(f"step {step}: {name} must be a bool, got {type(flag).__name__}")
    if not isinstance(info, dict):
        raise _CheckFailed(f"step {step}: info must be a dict, got {type(info).__name__}")
    return reward, terminated, truncated


def _random_episode(env: Any, seed: int, max_steps: int) -> str:
    from agentrl.core import as_messages

    solve = getattr(env.unwrapped, "solve", None)
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    if obs not in env.observation_space or not isinstance(info, dict):
        raise _CheckFailed("reset() returned an observation outside the space or a non-dict info")
    conversation = as_messages(obs)
    total, end = 0.0, f"stopped at the {max_steps}-step cap"
    for step in range(1, max_steps + 1):
        # Odd steps: random text; even steps: the scripted solver's (valid) action, if there is a solver.
        action = solve(list(conversation)) if callable(solve) and step % 2 == 0 else env.action_space.sample()
        conversation.append({"role": "assistant", "content": action})
        result = env.step(action)
        reward, terminated, truncated = _check_step(env, step, result)
        total += reward
        conversation.extend(as_messages(result[0]))
        if terminated or truncated:
            end = "terminated" if terminated else "truncated"
            break
    return f"random episode: {_steps(step)}, return {total:g}, {end}"


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


async def _async_check(env: Any, seed: int, sync_obs: Any) -> None:
    async_obs, _ = await env.areset(seed=seed)
    if sync_obs != async_obs:
        raise _CheckFailed("areset(seed) and reset(seed) gave different observations")
    env.action_space.seed(seed)
    _check_step(env, 1, await env.astep(env.action_space.sample()))
    await env.aclose()
