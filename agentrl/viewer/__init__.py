"""``agentrl view``: a local web page over a run directory (curves, trajectory list, token-level trajectories).

:mod:`agentrl.viewer.data` indexes the JSON-lines files by byte offset, :mod:`agentrl.viewer.tokens` turns token ids
into the exact text each shows, :mod:`agentrl.viewer.render` builds one trajectory's view (chat blocks over the
token arrays, diffs), :mod:`agentrl.viewer.server` serves the page and the JSON API, and
:mod:`agentrl.testing.browser` drives a headless Chromium over the DevTools protocol (tests and benchmarks).
What a training run writes for the viewer is :mod:`agentrl.controller.runlog`.
"""
