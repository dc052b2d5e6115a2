"""Helpers for agentrl's tests and benchmarks, not for training: envs and policies with scripted latency and
faults (:mod:`~agentrl.testing.manager_envs`, :mod:`~agentrl.testing.faulty_envs`, importable inside Ray env
workers by entry point) and a DevTools client for headless Chromium (:mod:`~agentrl.testing.browser`)."""
