"""One way to load a tokenizer (issue 32, item 1): ``agentrl train`` must encode episodes with the ids the model's
``tokenizer.json`` defines, for every family, in every template mode.

DeepSeek's published ``tokenizer_config.json`` declares ``LlamaTokenizerFast``, which splits text differently from its
``tokenizer.json``; the training controller once loaded it with ``AutoTokenizer`` while the chat module used
:func:`agentrl.chat.load_tokenizer`. These tests write each family's tokenizer files as published (the real DeepSeek
files; the class each family's config declares for the others), load them through the controller's own function
(:func:`agentrl.controller.run.run_tokenizer`) and compare every request's token ids with the reference (the
``tokenizer.json`` read as it is). A source scan fails if any other module loads a tokenizer directly.
"""

from __future__ import annotations

import ast
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the tests run with --import-mode=importlib
from chat_tokenizers import DEEPSEEK_DIR, template  # noqa: E402
from test_chat_families import (CASES, OUT, PLAIN_EPISODE, TOOL_EPISODE, TOOLS, ScriptEngine,  # noqa: E402
                                encode, tokenizer)

from agentrl.agent.loop import AgentLoopPolicy, RolloutConfig
from agentrl.chat import ChatConfig, TemplateError, load_tokenizer
from agentrl.controller.run import run_tokenizer
from agentrl.inference.config import EngineConfig
from agentrl.policy import EpisodeMeta

ROOT = Path(__file__).resolve().parents[2]

# The tokenizer_class each family's published tokenizer_config.json declares (DeepSeek: its real config is used).
PUBLISHED_CLASS = {"qwen2.5": "Qwen2Tokenizer", "qwen3-think": "Qwen2Tokenizer", "qwen3-nothink": "Qwen2Tokenizer",
                   "qwq": "Qwen2Tokenizer", "llama3": "PreTrainedTokenizerFast", "mistral": "PreTrainedTokenizerFast",
                   "glm-4.5": "PreTrainedTokenizerFast", "gpt-oss": "PreTrainedTokenizerFast",
                   "gemma3": "GemmaTokenizer", "gemma3-pythonic": "GemmaTokenizer"}


# Template mode strict, (tool episode, plain episode): passes where the template is prefix-stable for the episode.
STRICT = {"qwen2.5": ("passes", "passes"), "qwen3-think": ("refuses", "refuses"),
          "qwen3-nothink": ("refuses", "refuses"), "qwq": ("refuses", "refuses"), "llama3": ("passes", "passes"),
          "mistral": ("refuses", "refuses"), "deepseek-v3": ("refuses", "passes"),
          "deepseek-v3.1": ("passes", "passes"), "deepseek-v3.1-think": (None, "refuses"),
          "glm-4.5": ("refuses", "refuses"), "gpt-oss": ("refuses", "refuses"), "gemma3": (None, "passes"),
          "gemma3-pythonic": ("passes", "passes")}


# -- the source scan ------------------------------------------------------------------------------------------------
LOADERS = {"from_pretrained", "from_file", "from_str", "from_buffer"}


def direct_loads(source: str) -> list[str]:
    """Returns the direct tokenizer loads in ``source``: ``AutoTokenizer`` at all, ``<...Tokenizer...>.from_pretrained``
    / ``.from_file`` / ``.from_str`` / ``.from_buffer``, and a tokenizer class built from a file (``tokenizer_file=``,
    ``vocab_file=``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id == "AutoTokenizer" or \
                isinstance(node, ast.alias) and node.name.split(".")[-1] == "AutoTokenizer":
            found.append(f"line {getattr(node, 'lineno', '?')}: AutoTokenizer")
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in LOADERS:
            owner = ast.unparse(f.value)
            if "Tokenizer" in owner or "tokenizer" in owner.lower().split(".")[-1]:
                found.append(f"line {node.lineno}: {owner}.{f.attr}")
        name = ast.unparse(f)
        if "Tokenizer" in name and any(k.arg in ("tokenizer_file", "vocab_file") for k in node.keywords):
            found.append(f"line {node.lineno}: {name}(... from a file)")
    return found


def test_the_scan_finds_direct_loads():
    old = "from transformers import AutoTokenizer\ntok = AutoTokenizer.from_pretrained(str(model_dir))\n"
    assert len(direct_loads(old)) == 3  # the import, the name, the call
    assert direct_loads("from tokenizers import Tokenizer\nt = Tokenizer.from_file(p)\n") == ["line 2: Tokenizer.from_file"]
    assert direct_loads("t = transformers.PreTrainedTokenizerFast(tokenizer_file=p)\n")
    assert direct_loads("t = PreTrainedTokenizerFast(tokenizer_object=tok)\n") == []  # building one is not loading
    assert direct_loads("m = AutoModelForCausalLM.from_pretrained(p)\n") == []


def test_every_tokenizer_load_goes_through_load_tokenizer():
    """Only agentrl/chat/tokenizer.py loads tokenizers; agentrl/, envs/, benchmarks/ and examples/ call it."""
    allowed = {ROOT / "agentrl" / "chat" / "tokenizer.py"}
    skip = {ROOT / "agentrl" / "envs", ROOT / "agentrl" / "sandboxes"}  # links to envs/ and sandboxes/ (scanned there)
    offenders, scanned = [], 0
    for top in ("agentrl", "envs", "benchmarks", "examples"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path in allowed or any(s == p for s in skip for p in path.parents):
                continue
            scanned += 1
            offenders += [f"{path.relative_to(ROOT)} {hit}" for hit in direct_loads(path.read_text())]
    assert scanned > 50
    assert offenders == [], "load tokenizers with agentrl.chat.load_tokenizer:\n" + "\n".join(offenders)


# -- the example --------------------------------------------------------------------------------------------
def deepseek_dir(tmp_path: Path, chat_template: str | None = None) -> Path:
    """A model directory with DeepSeek-V3's published tokenizer files (``chat_template`` replaces the config's)."""
    d = tmp_path / "deepseek"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEEPSEEK_DIR / "tokenizer.json", d / "tokenizer.json")
    cfg = json.loads((DEEPSEEK_DIR / "tokenizer_config.json").read_text())
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False))
    return d


def test_deepseek_hello_world_gets_the_ids_of_its_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    d = deepseek_dir(tmp_path)
    text = "<｜User｜>Hello world!<｜Assistant｜>"
    want = [128803, 19923, 2058, 3, 128804]
    assert Tokenizer.from_file(str(d / "tokenizer.json")).encode(text, add_special_tokens=False).ids == want
    # The declared class splits differently: what agentrl train fed the loop before the fix.
    assert AutoTokenizer.from_pretrained(str(d))(text, add_special_tokens=False)["input_ids"] == \
        [128803, 42, 6629, 10030, 3, 128804]
    tok = run_tokenizer(EngineConfig(model=str(d)))
    assert tok(text, add_special_tokens=False)["input_ids"] == want
    assert tok.backend_tokenizer.encode(text, add_special_tokens=False).ids == want  # what the renderer encodes with
    assert tok.chat_template == template("deepseek-v3.jinja")
    # engine.tokenizer, when set, is the tokenizer directory (as the engines use it).
    assert run_tokenizer(EngineConfig(model="/nonexistent", tokenizer=str(d)))(text, add_special_tokens=False)[
        "input_ids"] == want


def test_load_tokenizer_reads_a_tokenizer_json_file_as_it_is():
    tok = load_tokenizer(DEEPSEEK_DIR / "tokenizer.json")
    assert tok.backend_tokenizer.encode("Hello world!", add_special_tokens=False).ids == [19923, 2058, 3]


# -- every family, every mode, through the controller's tokenizer ----------------------------------------------------
_DIRS: dict[str, Path] = {}


def model_dir(case: str, root: Path) -> Path:
    """The family's tokenizer files as published: tokenizer.json, and a tokenizer_config.json declaring its class."""
    if case not in _DIRS:
        if case.startswith("deepseek"):
            d = deepseek_dir(root / case, tokenizer(case).chat_template)
        else:
            d = root / case
            tokenizer(case).save_pretrained(d)
            cfg_path = d / "tokenizer_config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg["tokenizer_class"] = PUBLISHED_CLASS[case]
            cfg_path.write_text(json.dumps(cfg, ensure_ascii=False))
        _DIRS[case] = d
    return _DIRS[case]


async def episode(tok, case: str, kind: str, mode: str) -> tuple[list, str, str]:
    """Runs the scripted episode ``kind`` with ``tok``; returns the engine's requests (prompt, output) and the
    final token record, how it ended (``"done"`` or the TemplateError's text) and the first prompt's text."""
    ref = tokenizer(case)
    calls_out, plain_out = OUT[case]()
    outputs = calls_out if kind == "tools" else plain_out
    engine = ScriptEngine([encode(ref, o) for o in outputs])  # the model samples ids of its own vocabulary
    cfg = RolloutConfig(max_tokens_per_turn=512, max_context_tokens=16384,
                        chat=ChatConfig(template_mode=mode, **CASES[case][1]))
    tools = TOOLS if kind == "tools" else None
    policy = AgentLoopPolicy(engine, tok, cfg, tools=tools)
    s = policy.session(EpisodeMeta(f"{case}-{kind}", "g", "test/Env-v0", 0))
    script = TOOL_EPISODE if kind == "tools" else PLAIN_EPISODE
    first = s.chat.render([dict(m) for m in script[0]], add_generation_prompt=True, tools=tools)
    try:
        for msgs in script:
            await s.act([dict(m) for m in msgs])
    except TemplateError as e:
        return engine.calls, str(e), first
    rec = s.token_record()
    return engine.calls + [(rec.token_ids, rec.loss_mask)], "done", first


@pytest.mark.parametrize("case", list(CASES))
async def test_train_tokenizer_gives_the_reference_ids(case, tmp_path_factory):
    """keep, split and strict: every request (and the final record) is the same with the tokenizer agentrl train
    loads as with tokenizer.json itself, and the first prompt is the template's text encoded by tokenizer.json."""
    from tokenizers import Tokenizer

    d = model_dir(case, tmp_path_factory.getbasetemp() / "published")
    tok = run_tokenizer(EngineConfig(model=str(d)))
    ref = Tokenizer.from_file(str(d / "tokenizer.json"))
    kinds = ("tools", "plain") if OUT[case]()[0] is not None else ("plain",)
    for mode in ("keep", "split", "strict"):
        for kind in kinds if mode == "strict" else kinds[:1]:  # keep and split: one multi-turn episode
            want, want_end, _ = await episode(tokenizer(case), case, kind, mode)
            got, got_end, text = await episode(tok, case, kind, mode)
            assert got_end == want_end and got == want, (case, kind, mode)
            assert got[0][0] == ref.encode(text, add_special_tokens=False).ids, (case, kind, mode)
            assert want_end == "done" or mode == "strict" and "not prefix-stable" in want_end, want_end
            if mode == "strict":  # README's family table says which templates pass strict
                assert ("passes" if want_end == "done" else "refuses") == STRICT[case][kind == "plain"], (case, kind)


async def test_tiny_model_through_the_train_tokenizer():
    """The project's own family (``engine.model: tiny``) loads through the same function, with its file's ids."""
    from tokenizers import Tokenizer

    from agentrl.models import ensure_tiny_model

    tok = run_tokenizer(EngineConfig(model="tiny"))
    ref = Tokenizer.from_file(str(ensure_tiny_model() / "tokenizer.json"))
    text = tok.apply_chat_template(PLAIN_EPISODE[0], add_generation_prompt=True, tokenize=False)
    assert tok.backend_tokenizer.encode(text, add_special_tokens=False).ids == \
        ref.encode(text, add_special_tokens=False).ids
    for mode in ("keep", "split", "strict"):
        eos = tok.eos_token
        engine = ScriptEngine([ref.encode(a + eos, add_special_tokens=False).ids for a in ("5", "8", "7")])
        policy = AgentLoopPolicy(engine, tok, RolloutConfig(chat=ChatConfig(template_mode=mode)))
        s = policy.session(EpisodeMeta(f"tiny-{mode}", "g", "test/Env-v0", 0))
        for msgs in PLAIN_EPISODE:
            await s.act([dict(m) for m in msgs])
        assert engine.calls[0][0] == ref.encode(text, add_special_tokens=False).ids
        assert s.chat.family.name == "agentrl" and len(engine.calls) == 3
