"""Import paths of modules that moved, kept working for user code.

``import agentrl.pipeline`` (say) imports the module's new home and registers it under the old name too, with a
:class:`DeprecationWarning` naming the new place. Only the paths users may have written are kept; internal code
imports the new names (the architecture test checks it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "agentrl.pipeline": "agentrl.controller.run",
    "agentrl.train_config": "agentrl.controller.config",
    "agentrl.schedule": "agentrl.controller.batches",
    "agentrl.tail": "agentrl.controller.tail",
    "agentrl.warmstart": "agentrl.controller.warmstart",
    "agentrl.runlog": "agentrl.controller.runlog",
    "agentrl.rollout": "agentrl.agent.loop",
    "agentrl.envhost": "agentrl.manager.host",
    "agentrl.workers": "agentrl.manager.workers",
    "agentrl.manager_testing": "agentrl.testing.manager_envs",
    "agentrl.workers_testing": "agentrl.testing.faulty_envs",
    "agentrl.viewer.browser": "agentrl.testing.browser",
    "agentrl.trainer.group": "agentrl.trainer.dp_group",
    "agentrl.trainer.distributed": "agentrl.trainer.dp_rank",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        # The new module is already executed; the import system registers it under the old name as well.
        pass


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
