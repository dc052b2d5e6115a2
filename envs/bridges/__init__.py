"""Environments from other ecosystems, run unchanged: one module per ecosystem, each an optional extra.

============================ ============================================== =========================
id                           what                                           extra
============================ ============================================== =========================
``reasoning_gym/<dataset>``  a reasoning-gym dataset (family: every name)   ``agentrl[reasoning-gym]``
``textarena/<game id>``      a TextArena single-player game (family)        ``agentrl[textarena]``
``skyrl_gym/<env id>``       a SkyRL-Gym env per dataset row (``tasks=``)   ``agentrl[skyrl-gym]``
``mcp/Tools-v0``             the tools of any MCP server, tasks from JSONL  ``agentrl[mcp]``
``openenv/Client-v0``        a remote OpenEnv server (``url=``), over /ws   ``agentrl[openenv]``
``nemo_gym/Gymnasium-v0``    a NeMo Gym /reset + /step server (``url=``)    none (stdlib HTTP)
``nemo_gym/Tools-v0``        a NeMo Gym tool + /verify server (``url=``)    none (stdlib HTTP)
``gymnasium/<env id>``       a gymnasium env, its spaces put into text      none
``gem/<env id>``             a GEM env, in GEM's own venv (out of process)  its venv: see gem_env
``outproc/Env-v0``           any env made by ``factory=`` in another Python none (its own venv)
============================ ============================================== =========================

And the other way: ``agentrl envs serve ID`` serves any agentrl env as an OpenEnv server
(:mod:`agentrl.envs.bridges.openenv_server`).

This module is imported by ``import agentrl`` (through ``agentrl.envs``): it registers ids and families by name
only; each ecosystem's library is imported when one of its envs is made, and a missing one fails then with an
error naming the extra to install.
"""

from __future__ import annotations

import gymnasium

from agentrl.registration import families, register, register_family

_FAMILIES = {
    "reasoning_gym": dict(entry_point="agentrl.envs.bridges.reasoninggym:ReasoningGymEnv", name_kwarg="dataset",
                          names="agentrl.envs.bridges.reasoninggym:dataset_names", extra="reasoning-gym",
                          description="reasoning-gym dataset: one generated question, scored by its score_answer"),
    "textarena": dict(entry_point="agentrl.envs.bridges.textarena_env:TextArenaEnv", name_kwarg="game",
                      names="agentrl.envs.bridges.textarena_env:game_names", extra="textarena", max_episode_steps=64,
                      description="TextArena single-player game, played unchanged"),
    "skyrl_gym": dict(entry_point="agentrl.envs.bridges.skyrl_gym_env:SkyRLGymEnv", name_kwarg="env",
                      names="agentrl.envs.bridges.skyrl_gym_env:env_names", extra="skyrl-gym", max_episode_steps=32,
                      description="SkyRL-Gym env, made per dataset row (kwarg tasks=rows.jsonl)"),
    "gymnasium": dict(entry_point="agentrl.envs.bridges.gymnasium_text:GymnasiumTextEnv", name_kwarg="env",
                      names="agentrl.envs.bridges.gymnasium_text:env_names",
                      description="gymnasium env with its observations and actions put into text"),
    "gem": dict(entry_point="agentrl.envs.bridges.gem_env:GEMEnv", name_kwarg="env",
                names="agentrl.envs.bridges.gem_env:env_names", max_episode_steps=64,
                description="GEM env, run unchanged in GEM's own venv (python -m agentrl.envs.bridges.gem_env setup)"),
}
_IDS = {
    "mcp/Tools-v0": dict(entry_point="agentrl.envs.bridges.mcp_tools:MCPToolEnv", max_episode_steps=16,
                         description="An MCP server's tools as a multi-turn tool env (kwargs server= or url=, "
                                     "tasks=, checker=)"),
    "openenv/Client-v0": dict(entry_point="agentrl.envs.bridges.openenv_client:OpenEnvClientEnv",
                              description="A remote OpenEnv environment over its /ws WebSocket session "
                                          "(kwarg url=http://HOST:PORT)"),
    "nemo_gym/Gymnasium-v0": dict(entry_point="agentrl.envs.bridges.nemo_gym_client:NeMoGymEnv", max_episode_steps=64,
                                  description="A NeMo Gym Gymnasium-style resources server, /reset + /step with its "
                                              "session cookie (kwargs url=, tasks=rows.jsonl)"),
    # no max_episode_steps: the env's own max_steps ends an episode through /verify, as NeMo Gym's agent does
    "nemo_gym/Tools-v0": dict(entry_point="agentrl.envs.bridges.nemo_gym_tools:NeMoGymToolsEnv",
                              description="A NeMo Gym tool + /verify resources server: the row's tools run on the "
                                          "server, /verify gives the reward (kwargs url=, tasks=rows.jsonl)"),
    "outproc/Env-v0": dict(entry_point="agentrl.envs.bridges.outproc_env:HostedEnv",
                           description="An env run by another Python (own venv, own pins) behind a stdin/stdout "
                                       "host (kwargs python=, factory=module:callable, kwargs=)"),
}

_known = {f.namespace for f in families()}  # this module may be imported again (reloaded): register once
for _namespace, _fields in _FAMILIES.items():
    if _namespace not in _known:
        register_family(_namespace, **_fields)
for _id, _fields in _IDS.items():
    if _id not in gymnasium.registry:
        register(_id, **_fields)
