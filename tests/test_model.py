import math

import pytest
import torch

from model import GPT, GPTConfig, causal_attention

SMALL = dict(block_size=32, vocab_size=256, n_layer=3, n_head=4, n_embd=64)


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(n_embd=256, n_head=8), dict(vocab_size=50304, n_embd=128), dict(norm="layernorm", norm_position="post")],
)
def test_initial_loss_is_uniform_guessing(overrides):
    """A fresh model's loss is ~ln V: the scaled init makes its first predictions near-uniform."""
    torch.manual_seed(0)
    cfg = GPTConfig(**{**SMALL, **overrides})
    model = GPT(cfg)
    x = torch.randint(cfg.vocab_size, (8, cfg.block_size))
    y = torch.randint(cfg.vocab_size, (8, cfg.block_size))
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_causality(norm_position):
    """Changing token t+1 never changes the logits at positions <= t."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, norm_position=norm_position)).eval()
    x = torch.randint(256, (2, 32))
    logits, _ = model(x)
    for t in (0, 10, 30):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randint(256, changed[:, t + 1 :].shape)
        new_logits, _ = model(changed)
        torch.testing.assert_close(new_logits[:, : t + 1], logits[:, : t + 1], rtol=0, atol=1e-5)
        assert not torch.allclose(new_logits[:, t + 1 :], logits[:, t + 1 :])


def test_init_std_follows_the_stated_rule():
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=256, vocab_size=4096, n_layer=6, n_head=8, n_embd=512)
    model = GPT(cfg)
    C, L = cfg.n_embd, cfg.n_layer
    hidden = math.sqrt(2 / (5 * C))
    expected = {
        "wte.weight": 0.25 / math.sqrt(C),
        "wpe.weight": 0.25 / math.sqrt(C),
        "attn.c_attn.weight": hidden,
        "mlp.c_fc.weight": hidden,
        "attn.c_proj.weight": hidden / math.sqrt(2 * L),
        "mlp.c_proj.weight": hidden / math.sqrt(2 * L),
    }
    seen = set()
    for name, p in model.named_parameters():
        if p.dim() == 1:
            assert torch.equal(p, torch.ones_like(p)), name  # norm gains start at 1
            continue
        rule = next(k for k in expected if name.endswith(k))
        seen.add(rule)
        assert abs(p.mean().item()) < 0.05 * expected[rule], name
        assert p.std().item() == pytest.approx(expected[rule], rel=0.03), name
    assert seen == set(expected)
    assert model.lm_head.weight is model.wte.weight  # the head is the tied embedding


def test_naive_init_uses_one_std_everywhere_and_starts_far_above_ln_v():
    torch.manual_seed(0)
    cfg = GPTConfig(**SMALL, naive_init_std=1.0)
    model = GPT(cfg)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            assert p.std().item() == pytest.approx(1.0, rel=0.05), name  # c_proj too: no residual scaling
    x = torch.randint(cfg.vocab_size, (8, cfg.block_size))
    assert model(x, x)[1].item() > 3 * math.log(cfg.vocab_size)  # confidently wrong from the first step


def test_config_errors_name_the_values():
    with pytest.raises(ValueError, match="n_embd 130 is not divisible by n_head 4"):
        GPTConfig(n_embd=130, n_head=4)
    with pytest.raises(ValueError, match="norm 'batchnorm'"):
        GPTConfig(norm="batchnorm")
    with pytest.raises(ValueError, match="naive_init_std -1"):
        GPTConfig(naive_init_std=-1)


def test_counts_and_generate():
    torch.manual_seed(0)
    cfg = GPTConfig(**SMALL)
    model = GPT(cfg)
    C, L, V, T = cfg.n_embd, cfg.n_layer, cfg.vocab_size, cfg.block_size
    assert model.num_params() == V * C + T * C + L * (12 * C * C + 2 * C) + C
    out = model.generate(torch.zeros(2, 1, dtype=torch.long), 40, temperature=0.9, top_k=10)
    assert out.shape == (2, 41) and out.max() < V  # runs past block_size by cropping the context


def test_bf16_autocast_forward_backward_is_finite_on_cpu():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL))
    x = torch.randint(256, (4, 32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(x, x)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32  # the loss is summed in fp32
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in model.parameters())


def test_attention_runs_in_fp32_under_cpu_bf16_autocast():
    """The CPU's bf16 flash-attention kernel is slower than its fp32 one, so attention leaves autocast
    there: the same numbers as fp32 attention on the same (bf16-rounded) q, k, v."""
    q, k, v = (torch.randn(2, 4, 16, 8).bfloat16() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = causal_attention(q, k, v, 0.0)
    assert y.dtype == torch.float32
    expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
