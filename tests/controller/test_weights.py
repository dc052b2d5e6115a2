"""The controller's weight path (agentrl.controller.weights) without engines: what the driver does to join the
broadcast. The broadcast itself, end to end (the trainer making vLLM's init info of the driver's dict), is
test_train.py's two-replica run."""

import subprocess
import sys
import textwrap


def test_the_driver_joins_a_broadcast_without_importing_vllm():
    # Importing vLLM's weight-transfer modules costs ~12 s of a core on the CPU, on the critical path after the
    # engines are up; only the trainer needs them. A fresh interpreter, so that no other test's import counts.
    code = textwrap.dedent("""
        import asyncio, sys
        from agentrl.controller.weights import WeightSync
        from agentrl.inference.config import EngineConfig
        from agentrl.inference.replicas import ReplicatedEngine

        engine = object.__new__(ReplicatedEngine)  # the join needs the config and the live replicas, no engines
        engine.cfg, engine.alive, engine.replicas = EngineConfig(replicas=2, weight_sync="gloo"), [True, True], [1, 2]
        joined, order = [], []

        class Call:
            def __init__(self, name, result=None):
                self.name, self.result = name, result
            def __await__(self):
                order.append(self.name)
                yield from asyncio.sleep(0).__await__()
                return self.result

        class Method:
            def __init__(self, name, result=None):
                self.name, self.result = name, result
            def remote(self, *args):
                if self.name == "join_weight_broadcast":
                    joined.append(args)
                return Call(self.name, self.result)

        class Trainer:
            rendezvous = Method("rendezvous", ("127.0.0.1", 29555))
            join_weight_broadcast = Method("join_weight_broadcast")

        sync = WeightSync(Trainer(), engine, Call("prepare_weight_broadcast"))
        assert sync.path == "broadcast"
        asyncio.run(sync.start())
        assert order == ["prepare_weight_broadcast", "rendezvous", "join_weight_broadcast"], order
        assert "vllm" not in sys.modules, "the driver imported vllm to join the broadcast"
        (args, client), = joined
        assert args == {"weight_sync": "gloo", "master_address": "127.0.0.1", "master_port": 29555,
                        "world_size": 3, "rank": 0}, args
        assert client.handles == [1, 2]
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout[-2000:] + p.stderr[-4000:]
