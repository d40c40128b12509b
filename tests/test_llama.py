"""The llama arch (model.py, --arch llama): rotary positions, grouped-query attention, SwiGLU, q/k/v biases and an
untied head beside GPT-2's path; its parameter count in closed form; a run of it trained and resumed exactly. Its
data-parallel layouts against one process: tests/test_data_parallel.py."""

import json

import pytest
import torch

import checkpoint
import cost
import train
from conftest import write_word_corpus
from layout import check_layout
from model import GPT, GPTConfig, KVCache, apply_rope, rope_angles
from parallel import ParallelConfig, ProcessGrid, ShardedModel

LLAMA = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=32)


def test_rotary_positions_make_scores_depend_on_distance_only():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(q_position, k_position):
        turned_q = apply_rope(q, *rope_angles(16, q_position, 1, 10000.0, "cpu"))
        turned_k = apply_rope(k, *rope_angles(16, k_position, 1, 10000.0, "cpu"))
        return (turned_q * turned_k).sum().item()

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-5)  # the same distance, 4
    assert score(7, 3) != pytest.approx(score(9, 3), abs=1e-3)
    assert torch.equal(apply_rope(q, *rope_angles(16, 0, 1, 10000.0, "cpu")), q)  # position 0 turns nothing


def test_grouped_query_attention_keeps_fewer_keys_and_values():
    model = GPT(GPTConfig(**LLAMA))
    assert model.wpe is None and model.blocks[0].attn.c_attn.out_features == 64 + 2 * 32  # q 64, k and v 32 each
    cache = [KVCache() for _ in model.blocks]
    model(torch.randint(0, 256, (2, 5)), cache=cache)
    assert cache[0].k.shape == (2, 2, 5, 16)  # two key/value heads kept, not four


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
def test_the_kv_cache_gives_the_tokens_of_the_whole_context(n_kv_head):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**LLAMA, "n_kv_head": n_kv_head})).eval()
    prompt = torch.randint(0, 256, (2, 4))
    with_cache = model.generate(prompt, 40, temperature=0, kv_cache=True)  # past block_size 32: cropped
    without = model.generate(prompt, 40, temperature=0, kv_cache=False)
    assert torch.equal(with_cache, without)
    cache = [KVCache() for _ in model.blocks]
    full, _ = model(with_cache[:, :12])
    model(with_cache[:, :11], cache=cache)
    last, _ = model(with_cache[:, 11:12], cache=cache)  # position 11 turned by its own angle, past the prompt
    torch.testing.assert_close(last[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "extra",
    [{}, {"qkv_bias": True}, {"tie_embeddings": False}, {"n_kv_head": 1, "mlp_hidden": 100}, {"bias": True}],
)
def test_the_closed_form_counts_the_llama_parameters(extra):
    gpt_config = GPTConfig(**{**LLAMA, **extra})
    assert cost.parameters_on_rank(gpt_config) == GPT(gpt_config).num_params()
    assert GPTConfig(**LLAMA).hidden == 192  # 8 C / 3 = 170.7, up to a multiple of 64


def test_an_untied_head_is_a_matrix_of_its_own_in_checkpoints_too():
    tied = GPT(GPTConfig(**LLAMA))
    assert tied.lm_head.weight is tied.wte.weight
    model = GPT(GPTConfig(**LLAMA, tie_embeddings=False))
    assert model.lm_head.weight is not model.wte.weight
    grid = ProcessGrid(1, 1, 1)
    full = checkpoint.full_state_dict(ShardedModel(model, grid), grid)
    assert torch.equal(full["lm_head.weight"], model.lm_head.weight) and torch.equal(
        full["wte.weight"], model.wte.weight
    )
    assert not torch.equal(full["lm_head.weight"], full["wte.weight"])


def test_wrong_llama_settings_are_named():
    with pytest.raises(ValueError, match="n_kv_head 3 must divide n_head 4"):
        GPTConfig(**{**LLAMA, "n_kv_head": 3})
    with pytest.raises(ValueError, match="pass --arch llama"):
        GPTConfig(n_head=4, n_kv_head=2)
    with pytest.raises(ValueError, match="n_kv_head 2 is not divisible by tp 4"):
        check_layout(ParallelConfig(dp=1, tp=4), GPTConfig(**LLAMA), 8, 4, torch.float32)


def test_a_llama_run_learns_and_resumes_exactly(tmp_path):
    write_word_corpus(tmp_path / "corpus.txt", 2000)
    # fmt: off
    common = [
        "--source", tmp_path / "corpus.txt", "--data_dir", tmp_path / "data", "--arch", "llama", "--n_kv_head", 1,
        "--n_layer", 2, "--n_head", 2, "--n_embd", 32, "--block_size", 32, "--batch_size", 8, "--dtype", "float32",
        "--warmup_iters", 5, "--lr_decay_iters", 40, "--log_interval", 1, "--eval_interval", 20, "--eval_iters", 2,
        "--ckpt_interval", 20, "--num_samples", 0,
    ]
    # fmt: on
    train.main([str(a) for a in [*common, "--out_dir", tmp_path / "whole", "--max_iters", 40]])
    train.main([str(a) for a in [*common, "--out_dir", tmp_path / "halves", "--max_iters", 20]])
    train.main([str(a) for a in [*common, "--out_dir", tmp_path / "halves", "--max_iters", 40]])  # continued

    def losses(out):
        return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").open()) if "loss" in r}

    whole, halves = losses(tmp_path / "whole"), losses(tmp_path / "halves")
    assert whole == halves  # bit for bit, the second half resumed from the checkpoint of step 20
    assert whole[39] < 0.6 * whole[0]  # a word corpus the model learns within tens of steps
