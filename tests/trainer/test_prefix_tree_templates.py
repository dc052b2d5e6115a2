"""The prefix-tree layout on split-mode trajectories of real thinking templates (issue 27): Qwen3 with thinking and
QwQ, whose templates strip past reasoning and so rewrite history every turn, recorded through the agent loop with
the real Qwen vocabulary and a scripted engine (the episodes of tests/chat/test_chat_families.py). A tiny Qwen2
with that vocabulary trains on them: log-probs, gradients and the update of the tree layout equal the flat one's
(fp32, 1e-5), and the tree computes fewer tokens than the segments hold."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "chat"))  # the tests run with --import-mode=importlib
from test_chat_families import run_episode  # noqa: E402

from agentrl.trainer.batching import collate, prepare_sequences  # noqa: E402
from agentrl.trainer.config import OptimizerConfig, TrainerConfig  # noqa: E402
from agentrl.trainer.model import load_causal_lm, micro_batch_logprobs  # noqa: E402
from agentrl.trainer.trainer import Trainer  # noqa: E402
from agentrl.trajectory import Group, Trajectory  # noqa: E402

TOL = 1e-5
QWEN_VOCAB = 151_936  # Qwen2.5/3's embedding rows (the tokenizer's ids stop at 151,668)


@pytest.fixture(scope="module")
def qwen_vocab_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=QWEN_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=4096,
                      tie_word_embeddings=True)
    torch.manual_seed(7)
    d = tmp_path_factory.mktemp("tiny_qwen_vocab")
    Qwen2ForCausalLM(cfg).save_pretrained(str(d))
    return d


async def _group(case: str) -> Group:
    trajs = []
    for i, episode in enumerate(("plain", "tools")):
        s, _, _, _ = await run_episode(case, episode, "split")
        rec = s.token_record()
        t = Trajectory(id=f"{case}-{episode}", group_id=case, env_id="e", token_ids=rec.token_ids,
                       loss_mask=rec.loss_mask, logprobs=[x - 0.5 if m else x for x, m in zip(rec.logprobs,
                                                                                            rec.loss_mask)],
                       versions=[0 if m else -1 for m in rec.loss_mask], prompt_len=rec.prompt_len,
                       segments=rec.segments, reward=float(i))
        assert len(t.segment_slices()) >= 2, case  # the template rewrote history: a segment per rewrite
        trajs.append(t)
    return Group(id=case, trajectories=trajs)


@pytest.mark.parametrize("case", ["qwen3-think", "qwq"])
async def test_split_mode_template_segments_tree_equals_flat(qwen_vocab_model_dir: Path, case: str) -> None:
    group = await _group(case)
    seqs, _ = prepare_sequences(group.trajectories, [1.0, -1.0], vocab_size=QWEN_VOCAB, max_seq_len=None)
    model = load_causal_lm(qwen_vocab_model_dir, dtype=torch.float32, device=torch.device("cpu"),
                           disable_dropout=True)
    out = {}
    for tree in (False, True):
        mb = collate(seqs, torch.device("cpu"), tree=tree)
        model.zero_grad(set_to_none=True)
        logp, ent = micro_batch_logprobs(model, mb, impl="torch", compute_dtype=torch.float32, temperature=1.0,
                                         entropy=True, entropy_grad=True)
        ((logp * mb.mask).sum() + 0.1 * (ent * mb.mask).sum()).backward()
        out[tree] = (logp.detach(), ent.detach(), {k: p.grad.clone() for k, p in model.named_parameters()})
        if tree:
            # the segments repeat the system prompt and history: well under the flat tokens
            assert mb.input_ids.shape[1] < 0.75 * mb.num_tokens
    torch.testing.assert_close(out[True][0], out[False][0], atol=TOL, rtol=TOL)
    torch.testing.assert_close(out[True][1], out[False][1], atol=TOL, rtol=TOL)
    for k, g in out[False][2].items():
        torch.testing.assert_close(out[True][2][k], g, atol=TOL, rtol=TOL)

    params = {}
    for tree in (False, True):
        tr = Trainer(TrainerConfig(device="cpu", micro_batch_size=8, prefix_tree=tree,
                                   optimizer=OptimizerConfig(lr=1e-3)), qwen_vocab_model_dir)
        m = tr.train_step([group])
        params[tree] = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    assert m["batch/tree_ratio"] < 0.75
    for k, v in params[False].items():
        torch.testing.assert_close(params[True][k], v, atol=TOL, rtol=TOL)
