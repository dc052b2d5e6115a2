"""The trl side of ``bench_vs_trl.py``: GRPO with trl on an agentrl env, run in the benchmark's own venv.

Run by ``bench_vs_trl.py`` (never imported by agentrl; trl is not an agentrl dependency) as
``BENCH_VENV/bin/python benchmarks/trl_side.py SPEC.json`` with ``PYTHONPATH`` at the repository root, so that the
env, its tools and its reward are agentrl's own code. Flow:

    warm-started model (agentrl's warm start) -> GRPOTrainer(transformers generation on the CPU; a multi-turn task
    through ``environment_factory=ToolLookupTRL``, a single-turn task through ``SingleTurnReward``, a reward function
    that plays the completion as the episode's one action) -> every ``ckpt_every_s`` seconds of training: save_pretrained(OUT/ckpt/NNNN) with its
    timestamp in OUT/checkpoints.jsonl -> stop at ``budget_s`` -> OUT/result.json (token counts, generation and
    training times, peak RSS)

Fairness choices (see BENCHMARKS.md): the prompt is agentrl's (the system prompt describes the tools; the chat
template's own tools block is switched off, as agentrl's ``rollout.tools: false``), the episode reward is the sum of
the env's step rewards (as agentrl's), the group size, groups per step, learning rate (constant, no warm-up), sampling
temperature and turn limit are agentrl's config's; trl's per-completion budget covers all turns, so it gets
``max_turns * max_tokens_per_turn`` plus room for the tool results. Checkpoints are scored afterwards by the shared
scorer (``vs_trl_common.score``), so scoring costs the run nothing.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path


class ToolLookupTRL:
    """agentrl's ToolLookup env behind trl's environment protocol: ``reset(**row)`` plays the row's seed, the
    public methods are the tools (each call is one env step, as an agentrl tool turn), ``finish`` scores the final
    answer text with one more env step; ``total`` is the episode's summed reward."""

    def __init__(self) -> None:
        from agentrl.envs.tool_lookup import ToolLookupEnv

        self.env = ToolLookupEnv()
        self.total, self.done = 0.0, False

    def reset(self, seed: int, **_: object) -> None:
        self.env.reset(seed=int(seed))
        self.total, self.done = 0.0, False
        return None

    def lookup(self, name: str) -> str:
        """Returns the age and city of a person.

        Args:
            name: the person's name
        """
        return self._step("lookup", {"name": name})

    def calculator(self, expression: str) -> str:
        """Evaluates an arithmetic expression.

        Args:
            expression: e.g. 34 + 7
        """
        return self._step("calculator", {"expression": expression})

    def _step(self, tool: str, arguments: dict) -> str:
        from agentrl.tools import format_tool_call

        msgs, reward, term, _, _ = self.env.step(format_tool_call(tool, arguments))
        self.total += float(reward)
        self.done = self.done or bool(term)
        return "\n".join(str(m.get("content", "")) for m in msgs)

    def _finish(self, text: str) -> float:
        if not self.done:
            _, reward, term, _, _ = self.env.step(text)
            self.total += float(reward)
            self.done = bool(term)
        return self.total


class SingleTurnReward:
    """trl's reward function for a one-action agentrl env: the env's reward for the completion played as the only
    action of the episode of the row's ``seed`` (the env that made the prompt; its own scorer, its own parsing)."""

    __name__ = "env_reward"  # trl logs reward functions by name

    def __init__(self, env_id: str, env_kwargs: dict) -> None:
        import agentrl

        self.env = agentrl.make(env_id, **env_kwargs)

    def prompt(self, seed: int) -> list[dict]:
        obs, _ = self.env.reset(seed=int(seed))
        return [dict(m) for m in obs]

    def __call__(self, completions: list, seed: list, **_: object) -> list[float]:
        out = []
        for c, s in zip(completions, seed):
            self.env.reset(seed=int(s))
            out.append(float(self.env.step(_final_text(c))[1]))
        return out


def _final_text(completion: object) -> str:
    if isinstance(completion, list):
        last = next((m for m in reversed(completion) if m.get("role") == "assistant"), {})
        content = last.get("content", "")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content or "")
    return str(completion)


def episode_reward(completions: list, environments: list, **_: object) -> list[float]:
    """The env's summed episode reward: tool steps already counted, plus the final message scored by the env."""
    return [env._finish(_final_text(c)) for c, env in zip(completions, environments)]


def main(spec_path: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback

    import trl
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from agentrl.chat.tokenizer import load_tokenizer

    spec = json.loads(Path(spec_path).read_text())
    out = Path(spec["out"])
    (out / "ckpt").mkdir(parents=True, exist_ok=True)
    t_start = float(spec.get("t0", time.time()))
    torch.manual_seed(spec["seed"])
    torch.set_num_threads(int(spec.get("threads", 2)))

    tok = load_tokenizer(spec["tokenizer"])
    # agentrl's prompt: the system prompt describes the tools; the template's tools block stays off (rollout.tools).
    tok.chat_template = tok.chat_template.replace("{%- if tools -%}", "{%- if false -%}", 1)
    tok.response_template = qwen3_template  # trl parses tool calls only with templates it knows (PLATFORM.md)
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)

    if spec["max_turns"] == 1:  # one action: a plain reward function, no tool loop
        reward = SingleTurnReward(spec["env_id"], spec.get("env_kwargs", {}))
        rows = [{"prompt": reward.prompt(s), "seed": int(s)} for s in spec["train_seeds"]]
        env_kw: dict = {"reward_funcs": [reward]}
        loop_kw: dict = {}
    else:
        probe = ToolLookupTRL()
        rows = []
        for s in spec["train_seeds"]:
            obs, _ = probe.env.reset(seed=int(s))
            rows.append({"prompt": [dict(m) for m in obs], "seed": int(s)})
        env_kw = {"reward_funcs": [episode_reward], "environment_factory": ToolLookupTRL}
        loop_kw = {"max_tool_calling_iterations": spec["max_turns"] - 1}
    data = Dataset.from_list(rows)

    state = {"gen_s": 0.0, "gen_tokens": 0, "trained_tokens": 0, "steps": 0, "step_s": 0.0, "next_ckpt": 0.0,
             "ckpts": 0, "saved_step": -1}

    class TimedGRPO(GRPOTrainer):
        """Counts generation time and tokens (the rollout, tools and reward included) apart from the update."""

        def _generate_and_score_completions(self, inputs):  # noqa: D401 - trl's hook
            t = time.perf_counter()
            batch = super()._generate_and_score_completions(inputs)
            state["gen_s"] += time.perf_counter() - t
            cm = batch["completion_mask"]
            gen = cm * batch["tool_mask"] if "tool_mask" in batch else cm
            state["gen_tokens"] += int(gen.sum())
            state["trained_tokens"] += int(batch["prompt_mask"].sum() + cm.sum())
            return batch

    def save(step: int) -> None:
        d = out / "ckpt" / f"{state['ckpts']:04d}"
        model.save_pretrained(d)
        with open(out / "checkpoints.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "dir": str(d), "t": time.time() - t_start}) + "\n")
        state["ckpts"] += 1
        state["saved_step"] = step

    class Clock(TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            state["t_step"] = time.perf_counter()

        def on_step_end(self, args, st, control, **kw):
            state["steps"] = st.global_step
            state["step_s"] += time.perf_counter() - state["t_step"]
            elapsed = time.time() - t_start
            if elapsed >= state["next_ckpt"]:
                save(st.global_step)
                state["next_ckpt"] = elapsed + spec["ckpt_every_s"]
            if elapsed >= spec["budget_s"]:
                control.should_training_stop = True

    args = GRPOConfig(
        output_dir=str(out / "trainer"), use_cpu=True, bf16=False, seed=spec["seed"], report_to="none",
        per_device_train_batch_size=spec["episodes_per_step"], num_generations=spec["group_size"],
        learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_steps=100_000, save_strategy="no", logging_steps=1, temperature=spec["temperature"],
        max_completion_length=spec["max_completion_length"], beta=0.0, dataloader_num_workers=0,
        **loop_kw,
    )
    trainer = TimedGRPO(model=model, args=args, processing_class=tok, train_dataset=data, callbacks=[Clock()],
                        **env_kw)
    save(0)  # the warm start itself, at the time trl is ready to train
    state["next_ckpt"] = time.time() - t_start + spec["ckpt_every_s"]
    trainer.train()
    if state["saved_step"] != state["steps"]:
        save(state["steps"])
    rusage = resource.getrusage(resource.RUSAGE_SELF)
    result = {"trl": trl.__version__, "torch": torch.__version__, "steps": state["steps"],
              "gen_tokens": state["gen_tokens"], "gen_s": state["gen_s"], "trained_tokens": state["trained_tokens"],
              "train_s": state["step_s"] - state["gen_s"], "step_s": state["step_s"],
              "wall_s": time.time() - t_start, "cpu_s": rusage.ru_utime + rusage.ru_stime,
              "peak_rss_mib": rusage.ru_maxrss / 1024,
              "log": [h for h in trainer.state.log_history if "reward" in h][-3:]}
    (out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    main(sys.argv[1])
