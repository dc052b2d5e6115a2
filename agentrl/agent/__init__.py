"""The agent loop: how an episode becomes token ids.

:mod:`agentrl.agent.loop` is the vLLM agent loop, the :class:`~agentrl.policy.Policy` that renders each turn with
the model's chat template, samples token-in/token-out from an engine (:mod:`agentrl.inference`) and records every
generated token with its behavior log-prob and policy version. The environment manager drives it through the
:class:`~agentrl.policy.PolicySession` contract and never sees a token.
"""
