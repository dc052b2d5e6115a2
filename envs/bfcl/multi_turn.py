"""Multi-turn BFCL as an env: the user's turns, the model's tool calls run on ``bfcl_eval``'s executable backends
(file system, trading, travel, messaging, posting, tickets, vehicle, math) one step at a time, and the official
multi-turn checker's verdict as the reward.

The episode follows the leaderboard's inference loop for local models (``BaseHandler.inference_multi_turn_prompting``),
step for step:

- ``reset`` creates the item's backend instances from its ``initial_config`` (``execute_multi_turn_func_call``
  with no calls, as the loop does) and returns the first turn's messages as the format's handler builds them
  (plus ``info["tools"]`` in FC formats);
- each ``step(answer)`` records the answer (:func:`formats.recorded_answer`) and decodes it with the handler's
  ``decode_execute``. Calls decoded: they run on the episode's instances, in order, and the observation is one
  ``tool`` message per call (its result, or ``"Error during execution: ..."``), built by the handler. No call
  decoded (plain text, an empty list, or undecodable text): the turn ends, and the observation is the next turn's
  user message(s); a turn whose question is empty (``multi_turn_miss_func``) instead announces the held-out
  functions with ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING``, as the loop does;
- more than ``MAXIMUM_STEP_LIMIT`` (20) executed steps in one turn force-quit the episode, as the loop does (the
  checker then fails it unless it was the last turn);
- after the last turn (or a force-quit) the episode terminates and is graded by :func:`grading.grade_multi_turn`
  (``_evaluate_single_multi_turn_entry``: every step's answer replayed on fresh instances beside the ground truth,
  state and execution results checked after every turn).

Reward (``reward=``): ``"episode"`` (default) is 1.0 on the final step iff the official verdict is valid, 0
elsewhere. ``"turn"`` gives ``1/num_turns`` at the end of each turn whose prefix (turns 0..t) the checker accepts
(it judges the first t+1 turns only), so the return is the fraction of leading turns done right and 1.0 exactly
when the episode verdict is valid; it costs one replay per turn.

``info`` on every step: ``id``, ``category``, ``format``, ``turn``, ``step`` (executed steps in the turn);
``correct`` is False until the final step, which carries the verdict (``correct``, ``error_type``, ``error``) and
``result``, the recorded answers per turn and step (the ``result`` field of a BFCL result file). At turn ends
(``reward="turn"``): ``turn_valid``. Calls the :mod:`.safety` screen refuses are not run; their result says so.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from agentrl.core import Env, Message
from agentrl.envs.bfcl import categories, oracle, safety
from agentrl.envs.bfcl.data import ItemSelection, load_category
from agentrl.envs.bfcl.formats import DEFAULT_FORMAT, get_format, opening, recorded_answer, safe_handler, \
    tool_messages
from agentrl.envs.bfcl.grading import backend_methods, drop_instances, grade_multi_turn, new_model_name
from agentrl.envs.bfcl.official import load
from agentrl.envs.bfcl.single_turn import error_text

REFUSED = "Error during execution: agentrl refused to run this call (only calls of the available functions " \
          "with literal arguments are executed)"


class BFCLMultiTurnEnv(ItemSelection, Env):
    """One multi-turn BFCL item per episode (see the module docstring).

    ``category``: one of :data:`categories.MULTI_TURN`. ``format``: ``qwen_fc`` (default) or ``prompt``.
    ``reward``: ``"episode"`` or ``"turn"``. Item selection as in :class:`~.single_turn.BFCLEnv`.
    """

    description = "Berkeley Function-Calling Leaderboard (BFCL v4) multi-turn item on bfcl-eval's backends"

    def __init__(self, category: str = "multi_turn_base", format: str = DEFAULT_FORMAT,
                 reward: Literal["episode", "turn"] = "episode"):
        super().__init__()
        if category not in categories.MULTI_TURN:
            raise ValueError(f"BFCLMultiTurnEnv serves {', '.join(categories.MULTI_TURN)}; got {category!r} "
                             "(single-turn ones: BFCLEnv)")
        if reward not in ("episode", "turn"):
            raise ValueError(f"reward must be 'episode' or 'turn', got {reward!r}")
        self.bfcl = load()
        self.fmt = get_format(format)
        self.cat = load_category(category)
        self.category = category
        self.reward_mode = reward
        self.index: int | None = None
        self.turn = 0
        self.steps = 0
        self.responses: list[list[str]] = []
        self._model_name: str | None = None
        self._done = True

    # -- episode ----------------------------------------------------------------------------------------------------
    @property
    def entry(self) -> dict[str, Any]:
        return self.cat.prompt[self.index]

    @property
    def num_turns(self) -> int:
        return len(self.entry["question"])

    def _turn_messages(self, turn: int) -> list[Message]:
        msgs = copy.deepcopy(self.entry["question"][turn])
        held_out = self.entry.get("missed_function", {}).get(str(turn))
        if held_out is not None:
            # The loop's own words (and its own formatting of the docs: str() of the list).
            prompt = self.bfcl.prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
            msgs = [{"role": "user", "content": prompt.format(functions=held_out)}]
        return msgs

    def _execute(self, calls: list[str]) -> tuple[list[str], Any]:
        entry = self.entry
        return self.bfcl.multi_turn_utils.execute_multi_turn_func_call(
            calls, entry.get("initial_config", {}), entry["involved_classes"], self._model_name, entry["id"],
            long_context=("long_context" in self.category or "composite" in self.category), is_evaL_run=False)

    def _release(self) -> None:
        if self._model_name is not None:
            drop_instances(self._model_name)
            self._model_name = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._release()
        self.index = self._select(seed, options)
        self._safe = safe_handler(self.fmt, backend_methods(self.entry["involved_classes"]))
        self._model_name = new_model_name("agentrl_env")
        self._execute([])  # creates the instances from the item's initial_config, as the loop does
        self.turn, self.steps, self.responses = 0, 0, [[]]
        self._paid = 0.0  # reward="turn": what the episode has paid so far
        self._done = False
        messages, tools = opening(self.fmt, self.entry, self._turn_messages(0))
        info: dict[str, Any] = {"id": self.entry["id"], "index": self.index, "category": self.category,
                                "format": self.fmt.name, "turn": 0, "num_turns": self.num_turns}
        if tools is not None:
            info["tools"] = tools
        return messages, info

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {"id": self.entry["id"], "category": self.category, "format": self.fmt.name, "turn": self.turn,
                "step": self.steps, "correct": False, **extra}

    def step(self, action: str):
        if self._done or self.index is None:
            return [], 0.0, True, False, {"correct": False, "error_type": "not_running",
                                          "error": "step() called outside an episode; call reset()"}
        answer = recorded_answer(self.fmt, action if isinstance(action, str) else "")
        self.responses[self.turn].append(answer)
        calls = self._decode(answer)
        if calls:
            screened = safety.screen_calls(calls, self._safe.methods)
            results, _ = self._execute([c for c in screened if c != safety.BLOCKED_CALL])
            it = iter(results)
            results = [REFUSED if c == safety.BLOCKED_CALL else next(it) for c in screened]
            self.steps += 1
            obs = tool_messages(self.fmt, calls, results)
            if self.steps > self.bfcl.prompts.MAXIMUM_STEP_LIMIT:
                return self._finish(obs, force_quit=True)
            return obs, 0.0, False, False, self._info()
        return self._end_turn()

    def _decode(self, answer: str) -> list[str]:
        """The calls the loop would run for ``answer`` ([] when it decodes to none or not at all)."""
        try:
            calls = self._safe.decode_calls(answer, has_tool_call_tag=False)
        except Exception:  # noqa: BLE001 - the loop treats any decoding failure as "no call": the turn ends
            return []
        if self.bfcl.multi_turn_utils.is_empty_execute_response(calls) or not isinstance(calls, list):
            return []
        return calls

    def _end_turn(self):
        finished = self.turn
        reward, extra = 0.0, {}
        if self.reward_mode == "turn":
            ok = bool(grade_multi_turn(self.cat, self.index, self.fmt, self.responses, turns=finished + 1)["valid"])
            reward, extra = (1.0 / self.num_turns if ok else 0.0), {"turn_valid": ok}
            self._paid += reward
        self.turn, self.steps = self.turn + 1, 0
        if self.turn >= self.num_turns:
            return self._finish([], turn_reward=reward, extra=extra)
        self.responses.append([])
        return self._turn_messages(self.turn), reward, False, False, self._info(**extra)

    def _finish(self, obs: list[Message], force_quit: bool = False, turn_reward: float = 0.0,
                extra: dict[str, Any] | None = None):
        self._done = True
        result = grade_multi_turn(self.cat, self.index, self.fmt, self.responses)
        ok = bool(result.get("valid"))
        self._release()
        if self.reward_mode == "episode":
            reward = 1.0 if ok else 0.0
        elif ok:  # the episode return is 1.0 exactly when the verdict is valid (a force-quit in the last turn may be)
            reward = 1.0 - (self._paid - turn_reward)
        else:
            reward = turn_reward
        # The multi-turn evaluator nests its error ({"error": {"error_type", "error_message", ...}}).
        err = result.get("error")
        nested = err if isinstance(err, dict) else {}
        info = self._info(**(extra or {}))
        info.update(correct=ok, error_type=None if ok else nested.get("error_type", result.get("error_type")),
                    error=None if ok else nested.get("error_message") or error_text(result), force_quit=force_quit,
                    result=[list(r) for r in self.responses])
        return obs, reward, True, False, info

    def close(self) -> None:
        self._release()
        super().close()

    # -- scripted answers -------------------------------------------------------------------------------------------
    def oracle_answer(self, index: int, turn: int, calls_done: bool) -> str:
        """The ground-truth answer of item ``index`` at ``turn``: its calls, or (``calls_done``, or a turn whose
        ground truth is empty) a sentence without calls, which ends the turn."""
        truth = self.cat.answer(index)[turn] if turn < len(self.cat.answer(index)) else []
        if calls_done or not truth:
            return oracle.TURN_DONE_TEXT if calls_done else oracle.NO_CALL_TEXT
        classes = self.cat.prompt[index]["involved_classes"]
        return oracle.render(self.fmt, [oracle.multi_turn_call(c, classes) for c in truth])

    def solve(self, conversation: list[Message]) -> str:
        """The ground-truth answer at the current turn and step (``agentrl envs check``'s solver episode)."""
        if self.index is None:
            return oracle.NO_CALL_TEXT
        return self.oracle_answer(self.index, self.turn, calls_done=self.steps > 0)

    def oracle_policy(self):
        """A :class:`agentrl.policy.ScriptedPolicy` replaying each episode's ground truth: the item from
        ``meta.task`` (``{"instance_id": <BFCL id>}``), the turn from the conversation (turns end where a user
        message follows an assistant message; after the turn's tool results, a sentence without calls)."""
        from agentrl.policy import ScriptedPolicy

        def act(conversation: list[Message], meta: Any) -> str:
            i = self._item_of(meta)
            if i is None:
                raise ValueError(f"the BFCL oracle needs meta.task with the item id, got {getattr(meta, 'task', None)!r}")
            turn = sum(1 for a, b in zip(conversation, conversation[1:])
                       if a.get("role") == "assistant" and b.get("role") != "tool")
            return self.oracle_answer(i, turn, calls_done=bool(conversation) and conversation[-1].get("role") == "tool")

        return ScriptedPolicy(act)
