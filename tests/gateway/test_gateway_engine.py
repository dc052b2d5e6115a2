"""The gateway on the real vLLM engine (the tiny CPU model: the session's one engine, ``engine`` in conftest.py),
driven by real, unmodified clients: the ``openai`` Python client and mini-swe-agent's own agent loop (through
litellm), whose commands run in an agentrl bwrap sandbox. Every sampled token is checked against the engine's own
record (what ``generate`` returned: ids, log-probs, versions), and the trainer's log-probs of the assembled segments
against the engine's behaviour log-probs: equal only if every segment is exactly a context the engine saw. Then a
training step runs on gateway trajectories through the real trainer. The weight updates here relabel the same
weights with the next version, as every user of the shared engine does.
"""

from __future__ import annotations

import asyncio
import json
import os
import types

import openai
import pytest

from agentrl.chat import load_tokenizer
from agentrl.gateway import HARNESS_ENV_ID, Gateway, GatewayConfig, HarnessPolicy, HarnessResult
from agentrl.testing.recording import RecordingEngine
from agentrl.manager import EnvManager, EpisodeSpec, ManagerConfig

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]  # one engine + trainer start: ~10 min at load 40
TOL = 1e-4  # float32 engine vs float32 trainer (the weight-sync tests measure ~1e-6)

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Age and city of a person.",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    from agentrl.trainer.config import OptimizerConfig, TrainerConfig
    from agentrl.trainer.trainer import Trainer

    return Trainer(TrainerConfig(device="cpu", optimizer=OptimizerConfig(lr=1e-4)), tiny_model_dir)


def check_against_engine(traj, record, trainer):
    """100 % of the sampled tokens are in ``traj`` with the engine's log-prob and version, each once, in order within
    its segment; every segment is a prompt the engine got followed by what it returned; and the trainer, scoring each
    segment in its own context, gets the engine's log-probs."""
    traj.validate()
    sampled = [(t, lp, v) for _, g in record for t, lp, v in zip(g.token_ids, g.logprobs, g.versions)]
    got = [(t, lp, v) for t, m, lp, v in zip(traj.token_ids, traj.loss_mask, traj.logprobs, traj.versions) if m]
    assert len(got) == len(sampled) > 0 and sorted(got) == sorted(sampled)
    outputs = [(p, g.token_ids) for p, g in record]
    for a, b in traj.segment_slices():
        seg = traj.token_ids[a:b]
        assert any(seg[: len(p)] == p and seg[len(p): len(p) + len(o)] == o for p, o in outputs)
    lp = trainer.compute_logprobs([traj])[0]
    diffs = [abs(float(lp[i - 1]) - traj.logprobs[i]) for i, m in enumerate(traj.loss_mask) if m]
    assert max(diffs) < TOL, max(diffs)


async def test_openai_client_multi_turn_tools_stream_and_not(engine, tok, tiny_model_dir, trainer):
    from safetensors.torch import load_file

    eng = RecordingEngine(engine)
    async with Gateway(eng, tok, GatewayConfig(port=0), model_name="tiny") as gw, \
            openai.AsyncOpenAI(base_url=f"{gw.url}/s/tools/v1", api_key="x", max_retries=0) as c:
        msgs = [{"role": "system", "content": "Answer with tools."}, {"role": "user", "content": "How old is Ann?"}]
        for turn in range(4):
            if turn == 2:  # a weight update mid-session (same weights, next version): tokens keep their versions
                await engine.update_weights(load_file(str(tiny_model_dir / "model.safetensors")), engine.version + 1)
            kw = dict(model="tiny", messages=msgs, tools=TOOLS, max_tokens=12, temperature=1.0, seed=turn)
            if turn % 2:
                chunks = [ch async for ch in await c.chat.completions.create(stream=True, **kw)]
                content = "".join(d.delta.content or "" for ch in chunks for d in ch.choices)
                calls = [t for ch in chunks for d in ch.choices for t in (d.delta.tool_calls or [])]
                msg = {"role": "assistant", "content": content}
                if calls:
                    msg["tool_calls"] = [{"id": t.id, "type": "function", "function": {
                        "name": t.function.name, "arguments": t.function.arguments}} for t in calls]
            else:
                r = await c.chat.completions.create(**kw)
                msg = r.choices[0].message.model_dump(exclude_none=True)
                assert r.usage.completion_tokens == len(eng.record[-1][1].token_ids)
            msgs.append(msg)
            for call in msg.get("tool_calls", []):
                msgs.append({"role": "tool", "tool_call_id": call["id"], "content": "Ann: age 34"})
            msgs.append({"role": "user", "content": f"Go on ({turn})."})
        traj = gw.store.end("tools", reward=1.0)
    assert traj.info["gateway/requests"] == 4 and traj.info["gateway/drifts"] == 0 and traj.segments == []
    versions = {v for v, m in zip(traj.versions, traj.loss_mask) if m}
    assert len(versions) == 2  # tokens before and after the update
    check_against_engine(traj, eng.record, trainer)


async def test_streams_token_by_token_across_a_weight_update_and_a_hang_up(engine, tok, tiny_model_dir, trainer):
    """The engine's steps reach the client as it samples: the first deltas arrive before the session commits, a
    weight update (abort mode) lands mid-stream and the stream goes on with the resubmitted request, the streamed text
    is the one the gateway reads from the recorded tokens, and greedy streamed == greedy whole token for token; a
    client that hangs up mid-stream aborts its engine request and leaves nothing in its session."""
    from safetensors.torch import load_file

    from agentrl.gateway.choices import read_chat

    eng = RecordingEngine(engine)
    msgs = [{"role": "user", "content": "Tell me a long story."}]
    kw = dict(model="tiny", messages=msgs, max_tokens=300, temperature=0.0, extra_body={"ignore_eos": True})
    async with Gateway(eng, tok, GatewayConfig(port=0), model_name="tiny") as gw, \
            openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0) as c:
        # greedy, streamed and whole: the same tokens and the same text
        whole = (await c.chat.completions.create(extra_headers={"X-Agentrl-Session": "whole"}, **kw)).choices[0]
        text = "".join([d.delta.content or "" async for ch in await c.chat.completions.create(
            stream=True, extra_headers={"X-Agentrl-Session": "greedy"}, **kw) for d in ch.choices])
        assert text == whole.message.content and text
        a, b = (gw.store.sessions[s].token_record() for s in ("whole", "greedy"))
        assert a.token_ids == b.token_ids and max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < TOL

        # a weight update lands while the stream is under way
        v0 = engine.version
        parts, committed_at_first = [], None
        async for ch in await c.chat.completions.create(stream=True, extra_headers={"X-Agentrl-Session": "live"},
                                                        **{**kw, "temperature": 1.0, "seed": 3}):
            for d in ch.choices:
                parts.append(d.delta.content or "")
                if committed_at_first is None and "".join(parts):
                    committed_at_first = gw.store.sessions["live"].requests
                    await engine.update_weights(load_file(str(tiny_model_dir / "model.safetensors")), v0 + 1,
                                              pause_mode="abort")
        assert committed_at_first == 0
        s = gw.store.sessions["live"]
        assert s.stats["resubmits"] >= 1
        rec = s.token_record()
        sampled = [v for v, m in zip(rec.versions, rec.loss_mask) if m]
        assert set(sampled) == {v0, v0 + 1} and sampled == sorted(sampled) and len(sampled) == 300
        live = [(p, g) for p, g in eng.record[2:]]
        gen = types.SimpleNamespace(token_ids=[t for _, g in live for t in g.token_ids],
                                    logprobs=[x for _, g in live for x in g.logprobs],
                                    versions=[x for _, g in live for x in g.versions],
                                    finish_reason="length", stop_reason=None)
        choice, _ = read_chat(gw.renderer, live[0][0], gw.renderer.decode(live[0][0]), gen, None, "auto", 0, False,
                              "x")
        assert "".join(parts) == choice.content
        assert "stream_mismatch" not in gw.errors
        check_against_engine(gw.store.end("live", reward=1.0), live, trainer)  # log-probs and versions as sampled

        # hanging up mid-stream: the engine request is aborted, the session keeps nothing
        hung = asyncio.Event()
        counted = gw._hung_up
        gw._hung_up = lambda request: (counted(request), hung.set())
        n_record = len(eng.record)
        stream = await c.chat.completions.create(stream=True, extra_headers={"X-Agentrl-Session": "gone"}, **kw)
        async for ch in stream:
            if any(d.delta.content for d in ch.choices):
                break
        await stream.close()
        await asyncio.wait_for(hung.wait(), 120)
        assert "gone" not in gw.store.sessions and len(eng.record) == n_record  # nothing returned, nothing kept
        r = await c.chat.completions.create(extra_headers={"X-Agentrl-Session": "gone"}, **{**kw, "max_tokens": 5})
        assert r.usage.completion_tokens == 5 and gw.store.sessions["gone"].requests == 1
        assert not engine._llm.output_processor.has_unfinished_requests()


async def test_a_stream_interval_sends_its_tokens_in_fewer_deltas_with_the_same_text(engine, tok):
    """``stream_interval: 8``: 64 greedy tokens reach the client in at most 1 + 8 content deltas (the first token at
    once, then 8 at a time; one more where the parser held a tail back to the end), with the whole reply's text."""
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Tell me a long story."}], max_tokens=64,
              temperature=0.0, extra_body={"ignore_eos": True})
    async with Gateway(engine, tok, GatewayConfig(port=0, stream_interval=8), model_name="tiny") as gw, \
            openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0) as c:
        whole = (await c.chat.completions.create(extra_headers={"X-Agentrl-Session": "w"}, **kw)).choices[0]
        deltas = [d.delta.content async for ch in await c.chat.completions.create(
            stream=True, extra_headers={"X-Agentrl-Session": "s"}, **kw) for d in ch.choices if d.delta.content]
        assert "".join(deltas) == whole.message.content
        assert 1 < len(deltas) <= 10, deltas
        assert gw.store.sessions["s"].token_record().token_ids == gw.store.sessions["w"].token_record().token_ids


async def test_anthropic_client_multi_turn_tools_stream_and_not(engine, tok, trainer):
    """The same record through Anthropic's Messages dialect (the official ``anthropic`` client): the session's tokens
    are the gateway's rendering plus what the engine sampled, with the engine's log-probs and versions."""
    import anthropic

    eng = RecordingEngine(engine)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    async with Gateway(eng, tok, GatewayConfig(port=0, max_tokens=12), model_name="tiny") as gw, \
            anthropic.AsyncAnthropic(base_url=f"{gw.url}/s/claude", api_key="x", max_retries=0) as c:
        msgs = [{"role": "user", "content": "How old is Ann?"}]
        for turn in range(4):
            kw = dict(model="tiny", system="Answer with tools.", messages=msgs, tools=tools, max_tokens=4096)
            if turn % 2:
                async with c.messages.stream(**kw) as st:
                    r = await st.get_final_message()
            else:
                r = await c.messages.create(**kw)
            prompt, gen = eng.record[-1]
            assert r.usage.input_tokens == len(prompt) and r.usage.output_tokens == len(gen.token_ids)
            assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
            msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
            results = [{"type": "tool_result", "tool_use_id": b.id, "content": "Ann: age 34"}
                       for b in r.content if b.type == "tool_use"]
            msgs.append({"role": "user", "content": results + [{"type": "text", "text": f"Go on ({turn})."}]})
        s = gw.store.sessions["claude"]
        rendered = gw.renderer.encode(gw.renderer.render(
            [{"role": "system", "content": "Answer with tools."}, {"role": "user", "content": "How old is Ann?"}],
            add_generation_prompt=True, tools=TOOLS))
        assert s.segments[0].token_ids[: len(rendered)] == rendered  # the prompt is the gateway's rendering
        traj = gw.store.end("claude", reward=1.0)
    assert traj.info["gateway/requests"] == 4 and traj.info["gateway/drifts"] == 0 and traj.segments == []
    check_against_engine(traj, eng.record, trainer)


async def test_responses_client_multi_turn_tools_stream_and_not(engine, tok, trainer):
    """The same record through OpenAI's Responses dialect (the official client), by whole input and by
    ``previous_response_id``."""
    eng = RecordingEngine(engine)
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    async with Gateway(eng, tok, GatewayConfig(port=0, max_tokens=12), model_name="tiny") as gw, \
            openai.AsyncOpenAI(base_url=f"{gw.url}/s/codex/v1", api_key="x", max_retries=0) as c:
        items: list = [{"role": "user", "content": "How old is Ann?"}]
        prev = None
        for turn in range(4):
            kw = dict(model="tiny", instructions="Answer with tools.", tools=tools, temperature=1.0)
            if turn % 2:
                events = [e async for e in await c.responses.create(stream=True, input=items, **kw)]
                r = events[-1].response
            else:  # only the new items, after the response the gateway holds
                r = await c.responses.create(input=items[prev:] if prev else items,
                                             previous_response_id=r.id if prev else None, **kw)
            prompt, gen = eng.record[-1]
            assert r.usage.input_tokens == len(prompt) and r.usage.output_tokens == len(gen.token_ids)
            items += [o.model_dump(exclude_none=True) for o in r.output]
            prev = len(items)
            items += [{"type": "function_call_output", "call_id": o.call_id, "output": "Ann: age 34"}
                      for o in r.output if o.type == "function_call"]
            items.append({"role": "user", "content": f"Go on ({turn})."})
        rendered = gw.renderer.encode(gw.renderer.render(
            [{"role": "system", "content": "Answer with tools."}, {"role": "user", "content": "How old is Ann?"}],
            add_generation_prompt=True, tools=TOOLS))
        assert gw.store.sessions["codex"].segments[0].token_ids[: len(rendered)] == rendered
        traj = gw.store.end("codex", reward=1.0)
    assert traj.info["gateway/requests"] == 4 and traj.info["gateway/drifts"] == 0 and traj.segments == []
    check_against_engine(traj, eng.record, trainer)


async def test_history_rewriting_harness_yields_segments_the_engine_saw(engine, tok, trainer):
    eng = RecordingEngine(engine)
    async with Gateway(eng, tok, GatewayConfig(port=0), model_name="tiny") as gw, \
            openai.AsyncOpenAI(base_url=f"{gw.url}/s/rw/v1", api_key="x", max_retries=0) as c:
        msgs = [{"role": "user", "content": "Step 1."}]
        for turn in range(4):
            r = await c.chat.completions.create(model="tiny", messages=msgs, max_tokens=10)
            msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            msgs.append({"role": "user", "content": f"Step {turn + 2}."})
            if turn == 1:  # the harness compacts its context: the first exchange becomes a summary
                msgs = [{"role": "user", "content": "Summary of steps so far."}] + msgs[2:]
            if turn == 2:  # ... and edits the model's last answer
                msgs[-2] = {"role": "assistant", "content": "edited"}
        traj = gw.store.end("rw")
    assert traj.info["gateway/drifts"] == 2 and len(traj.segments) == 3
    check_against_engine(traj, eng.record, trainer)


async def test_command_line_server_serves_and_writes_every_session(engine, tmp_path):
    """``agentrl gateway``'s server (``serve``, as the command runs it, on this module's engine): the tiny model by
    name, chat and completions in their sessions, and the sessions live at shutdown written to ``out``."""
    import socket

    import aiohttp

    from agentrl.commands.gateway import GatewayRunConfig, serve
    from agentrl.trajectory import Trajectory

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "sessions.jsonl"
    stop = asyncio.Event()
    server = asyncio.ensure_future(serve(GatewayRunConfig(model="tiny", gateway=GatewayConfig(port=port, out=str(out))),
                                         stop, engine=engine))
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                try:
                    async with http.get(base + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
        async with openai.AsyncOpenAI(base_url=base + "/s/chat/v1", api_key="x", max_retries=0) as c:
            assert [m.id for m in (await c.models.list()).data] == ["tiny"]
            r = await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
        async with openai.AsyncOpenAI(base_url=base + "/s/text/v1", api_key="x", max_retries=0) as c:
            r2 = await c.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6)
    finally:
        stop.set()
        assert await asyncio.wait_for(server, 60) == 0
    rows = {t.id: t for t in (Trajectory.from_json(x) for x in out.read_text().splitlines())}
    assert set(rows) == {"chat", "text"} and all(t.termination == "truncated" for t in rows.values())
    assert rows["chat"].num_generated == r.usage.completion_tokens and rows["text"].num_generated == \
        r2.usage.completion_tokens
    from agentrl.inference.base import SamplingParams

    gen = await engine.generate([1, 2, 3], SamplingParams(max_tokens=1), request_id="after-serve")
    assert len(gen.token_ids) == 1  # a lent engine is not closed with the server


class SandboxShell:
    """mini-swe-agent's ``Environment`` protocol (``execute``, ``get_template_vars``, ``serialize``) over an
    agentrl sandbox: the agent's commands run in bwrap, never on the host. ``execute`` is called from the agent's
    thread and runs the sandbox call on the event loop."""

    def __init__(self, sandbox, loop):
        self.sb, self.loop, self.executed = sandbox, loop, []
        self.config = types.SimpleNamespace(cwd="/workspace", timeout=10)

    def execute(self, action, cwd="", *, timeout=None):
        from minisweagent.exceptions import Submitted

        cmd = action.get("command", "")
        res = asyncio.run_coroutine_threadsafe(self.sb.exec(cmd, timeout=timeout or 10), self.loop).result()
        self.executed.append((cmd, res.exit_code))
        lines = res.output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" and res.exit_code == 0:
            raise Submitted({"role": "exit", "content": "".join(lines[1:]),
                             "extra": {"exit_status": "Submitted", "submission": "".join(lines[1:])}})
        return {"output": res.output, "returncode": res.exit_code,
                "exception_info": "timed out" if res.timed_out else ""}

    def get_template_vars(self, **kwargs):
        return {"cwd": "/workspace", **kwargs}

    def serialize(self):
        return {"info": {"environment_type": "agentrl-sandbox"}}


async def test_mini_swe_agent_runs_unmodified_and_its_session_trains(engine, tok, trainer, tmp_path):
    from agentrl.sandboxes import SandboxSpec, bwrap_available, create_sandbox

    ok, why = bwrap_available()
    assert ok, f"bwrap is needed for this test (CI has it): {why}"
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: litellm's bundled price map
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mswea"))
    loop = asyncio.get_running_loop()
    shells = []

    def run_agent(ctx, sandbox):
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

        # The agent's own loop and model class, configured as a user points it at a local OpenAI-compatible server.
        # The tiny model writes no ```mswea_bash_command``` block, so the action regex takes its first 40 characters
        # as the command (garbage, run in the sandbox). ignore_eos: fewer replies with no text for a command.
        model = LitellmTextbasedModel(model_name=f"openai/{ctx.model}", cost_tracking="ignore_errors",
                                      action_regex=r"\A(.{1,40})",
                                      model_kwargs={"api_base": ctx.base_url, "api_key": ctx.api_key,
                                                    "max_tokens": 16, "temperature": 1.0,
                                                    "extra_body": {"ignore_eos": True}})
        shell = SandboxShell(sandbox, loop)
        shells.append(shell)
        agent = DefaultAgent(model, shell, system_template="You are a shell agent. Reply with one command.",
                             instance_template="Task: {{task}}", step_limit=3, cost_limit=0)
        out = agent.run(str(ctx.task))
        shell.format_errors = sum(m.get("extra", {}).get("interrupt_type") == "FormatError" for m in agent.messages)
        return out

    async def harness(ctx):
        async with create_sandbox(SandboxSpec(backend="bwrap", image="agentrl-busybox:latest")) as sb:
            out = await asyncio.to_thread(run_agent, ctx, sb)
            probe = await sb.exec("echo sandboxed; id -u", timeout=10)
        return HarnessResult(1.0 if out.get("exit_status") == "Submitted" else 0.0,
                             {"exit_status": out.get("exit_status"), "probe": probe.output})

    eng = RecordingEngine(engine)
    pol = HarnessPolicy(eng, tok, harness, GatewayConfig(port=0, sampling="config", temperature=1.0))
    try:
        async with EnvManager(ManagerConfig(max_turns=16), pol) as m:
            trajs = await m.run_episodes([EpisodeSpec(HARNESS_ENV_ID, seed=s, task="list the files") for s in (0, 1)])
    finally:
        await pol.aclose()
    for t in trajs:
        assert t.termination == "terminated", t.error
        assert t.info["exit_status"] == "LimitsExceeded" and t.info["probe"].startswith("sandboxed\n1000")
        assert t.info["gateway/requests"] == 3 and t.num_turns == 4
    assert all(len(g.token_ids) == 16 for _, g in eng.record)  # ignore_eos reached the engine through litellm
    # every step's command ran in the sandbox (a reply with no text left for a command is the agent's format error)
    assert all(len(s.executed) + s.format_errors == 3 and s.executed for s in shells)
    sampled = [(t, lp, v) for _, g in eng.record for t, lp, v in zip(g.token_ids, g.logprobs, g.versions)]
    got = [(x, lp, v) for t in trajs for x, m, lp, v in zip(t.token_ids, t.loss_mask, t.logprobs, t.versions) if m]
    assert sorted(got) == sorted(sampled)  # 100 % of the sampled tokens, across both sessions
    for t in trajs:
        lp = trainer.compute_logprobs([t])[0]
        assert max(abs(float(lp[i - 1]) - t.logprobs[i]) for i, m in enumerate(t.loss_mask) if m) < TOL
    # a training step on the two gateway trajectories, through the real trainer
    metrics = trainer.train_step(trajs, advantages=[1.0, -1.0])
    assert metrics["batch/loss_tokens"] == sum(t.num_generated for t in trajs)
    assert all(isinstance(metrics[k], float) and metrics[k] == metrics[k] for k in ("loss", "grad_norm"))
    json.dumps(metrics)
