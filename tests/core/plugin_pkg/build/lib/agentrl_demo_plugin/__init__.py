"""A third-party env package: agentrl never names it; its entry point registers the env."""

import agentrl


class Echo(agentrl.Env):
    """Repeat the word you are given."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = ["alpha", "beta", "gamma"][int(self.np_random.integers(3))]
        return [{"role": "user", "content": f"Say {self.word}."}], {}

    def step(self, action):
        ok = action.strip() == self.word
        return [{"role": "user", "content": "right" if ok else "wrong"}], float(ok), True, False, {}


def register_envs():
    agentrl.register("demo/Echo-v0", entry_point="agentrl_demo_plugin:Echo", max_episode_steps=3)
