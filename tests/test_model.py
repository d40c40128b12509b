import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from errors import UserError
from machinery.components.sample import generate
from machinery.job.arms import ArmedGPT, ArmsConfig
from model import GPT, GPTConfig, causal_attention, clm_loss

SMALL = dict(block_size=32, vocab_size=256, n_layer=3, n_head=4, n_embd=64)


def first_loss(model, gpt_config, batch=8):
    """A fresh model's mean next-token cross-entropy on random tokens, from its logits (PyTorch's own loss)."""
    x = torch.randint(gpt_config.vocab_size, (batch, gpt_config.block_size))
    y = torch.randint(gpt_config.vocab_size, (batch, gpt_config.block_size))
    logits, _ = model(x)  # (B, T, V)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item()


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="pre-LN, rmsnorm"),
        pytest.param(dict(n_embd=256, n_head=8), id="n_embd=256"),
        pytest.param(dict(vocab_size=50304, n_embd=128), id="vocab=50304"),
        pytest.param(dict(norm="layernorm", bias=True), id="layernorm, biases"),
    ],
)
def test_initial_loss_is_uniform_guessing(overrides):
    """A fresh model's loss is ~ln V: the scaled init makes its first predictions near-uniform."""
    torch.manual_seed(0)
    gpt_config = GPTConfig(**{**SMALL, **overrides})
    loss, uniform = first_loss(GPT(gpt_config), gpt_config), math.log(gpt_config.vocab_size)
    assert abs(loss - uniform) < 0.1, (
        f"a fresh model guesses near-uniformly: its first loss is within 0.1 of ln V = {uniform:.3f}, got {loss:.3f}"
    )


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_causality(norm_position):
    """Changing token t+1 never changes the logits at positions <= t (and under arms.py's Post-LN)."""
    torch.manual_seed(0)
    model = ArmedGPT(ArmsConfig(**SMALL, norm_position=norm_position)).eval()
    x = torch.randint(256, (2, 32))
    logits, _ = model(x)
    for t in (0, 10, 30):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randint(256, changed[:, t + 1 :].shape)
        new_logits, _ = model(changed)
        torch.testing.assert_close(new_logits[:, : t + 1], logits[:, : t + 1], rtol=0, atol=1e-5)
        assert not torch.allclose(new_logits[:, t + 1 :], logits[:, t + 1 :])


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(n_layer=6, n_embd=512, vocab_size=4096), id="L=6, C=512"),
        pytest.param(
            dict(n_layer=2, n_embd=256, vocab_size=2048, bias=True, norm="layernorm"),
            id="L=2, C=256, biases, layernorm",
        ),
        # rotary positions (no wpe), a SwiGLU MLP whose c_proj is a residual projection too, GQA, q/k/v biases
        pytest.param(
            dict(arch="llama", n_layer=4, n_embd=256, vocab_size=2048, n_kv_head=2, qkv_bias=True),
            id="llama L=4, C=256, SwiGLU, GQA, qkv biases",
        ),
        # an untied head is a matrix of its own, drawn as the embedding it would otherwise be
        pytest.param(
            dict(arch="llama", n_layer=3, n_embd=256, vocab_size=2048, tie_embeddings=False),
            id="llama L=3, C=256, untied head",
        ),
    ],
)
def test_init_std_follows_the_stated_rule(overrides):
    """Each matrix has the std its rule states, on GPT-2's block and Llama's, with the head tied or not; biases 0,
    norm weights 1."""
    torch.manual_seed(0)
    gpt_config = GPTConfig(**{**dict(block_size=256, n_head=8), **overrides})
    model = GPT(gpt_config)
    C, L = gpt_config.n_embd, gpt_config.n_layer
    embedding, hidden = 0.25 / math.sqrt(C), math.sqrt(2 / (5 * C))
    tied = gpt_config.tie_embeddings
    expected = {  # name ending: (std, the rule in words)
        "wte.weight": (embedding, "the token embedding (the head too, when tied): 0.25 / sqrt(C)"),
        "attn.c_attn.weight": (hidden, "a Linear reading the residual stream: sqrt(2 / (5 C))"),
        "mlp.c_fc.weight": (hidden, "a Linear reading the residual stream: sqrt(2 / (5 C))"),
        "attn.c_proj.weight": (hidden / math.sqrt(2 * L), "a residual projection: sqrt(2 / (5 C)) / sqrt(2 L)"),
        "mlp.c_proj.weight": (hidden / math.sqrt(2 * L), "a residual projection: sqrt(2 / (5 C)) / sqrt(2 L)"),
    }
    if gpt_config.arch == "gpt2":  # llama's positions are rotary: no matrix to draw
        expected["wpe.weight"] = (embedding, "the position embedding: 0.25 / sqrt(C), like the token embedding")
    if not tied:
        expected["lm_head.weight"] = (embedding, "the untied head: 0.25 / sqrt(C), scoring as the tied one")
    seen = set()
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            assert torch.equal(p, torch.zeros_like(p)), (
                f"biases start at 0: expected every value of {name} 0, got values up to {p.abs().max().item():.3g}"
            )
        elif p.dim() == 1:
            assert torch.equal(p, torch.ones_like(p)), (
                f"norm weights start at 1 (the init leaves them alone): {name} has mean {p.mean().item():.3g}, "
                f"std {p.std().item():.3g}"
            )
        else:
            rule = next(k for k in expected if name.endswith(k))
            seen.add(rule)
            std, words = expected[rule]
            assert p.std().item() == pytest.approx(std, rel=0.03), (
                f"{name} has the std of {words} = {std:.5f}: got {p.std().item():.5f}"
            )
            assert abs(p.mean().item()) < 0.05 * std, f"{name} is centred on 0: got mean {p.mean().item():.3g}"
    assert seen == set(expected), f"every kind of matrix is there: missing {set(expected) - seen}"
    assert (model.lm_head.weight is model.wte.weight) == tied, (
        f"tie_embeddings {tied}: expected the head {'to be' if tied else 'not to be'} the token embedding's matrix, "
        f"got {'one matrix' if model.lm_head.weight is model.wte.weight else 'two'}"
    )


def test_naive_init_uses_one_std_everywhere_and_starts_far_above_ln_v():
    """arms.py's --naive_init_std: the counterfactual of the width-scaled init."""
    torch.manual_seed(0)
    gpt_config = ArmsConfig(**{**SMALL, "n_embd": 128}, bias=True, naive_init_std=0.02)
    for name, p in ArmedGPT(gpt_config).named_parameters():
        if name.endswith(".bias"):
            assert torch.equal(p, torch.zeros_like(p)), (
                f"the naive init zeroes biases too: expected every value of {name} 0, got values up to "
                f"{p.abs().max().item():.3g}"
            )
        elif p.dim() == 1:
            assert torch.equal(p, torch.ones_like(p)), (
                f"the naive init leaves norm weights at 1: expected every value of {name} 1, got mean "
                f"{p.mean().item():.3g}, std {p.std().item():.3g}"
            )
        else:
            assert p.std().item() == pytest.approx(0.02, rel=0.05), (
                f"--naive_init_std 0.02 gives every matrix and embedding std 0.02, residual projections too (no "
                f"depth scaling): {name} has std {p.std().item():.5f}"
            )
    gpt_config = ArmsConfig(**SMALL, naive_init_std=1.0)
    loss, uniform = first_loss(ArmedGPT(gpt_config), gpt_config), math.log(gpt_config.vocab_size)
    assert loss > 3 * uniform, (
        f"naive_init_std 1.0 is confidently wrong from the first step: expected a first loss above 3 ln V = "
        f"{3 * uniform:.2f}, got {loss:.2f}"
    )


def test_generic_embedding_init_rescales_the_embeddings_and_head_only():
    """arms.py's --embedding_init generic: the embeddings and the head at the hidden matrices' std, every other
    weight the GPT's own draw, and a first loss further above ln V (logits of std ~0.63 instead of 0.25)."""
    for tie in (True, False):
        torch.manual_seed(0)
        own = ArmedGPT(ArmsConfig(**{**SMALL, "n_embd": 128}, tie_embeddings=tie))
        torch.manual_seed(0)
        generic = ArmedGPT(ArmsConfig(**{**SMALL, "n_embd": 128}, tie_embeddings=tie, embedding_init="generic"))
        scale = GPT.init_std(128) / GPT.embedding_std(128)
        for (name, a), (_, b) in zip(own.named_parameters(), generic.named_parameters()):
            rescaled = name.startswith(("wte", "wpe")) or (name.startswith("lm_head") and not tie)
            assert torch.allclose(b, a * scale if rescaled else a, rtol=1e-6), (
                f"tie_embeddings={tie}: {name} is {'the own draw x ' + f'{scale:.3f}' if rescaled else 'unchanged'}"
            )
    gpt_config = ArmsConfig(**SMALL)
    torch.manual_seed(0)
    own_loss = first_loss(ArmedGPT(gpt_config), gpt_config)
    torch.manual_seed(0)
    generic_loss = first_loss(ArmedGPT(replace(gpt_config, embedding_init="generic")), gpt_config)
    assert math.log(gpt_config.vocab_size) < own_loss < generic_loss, (own_loss, generic_loss)
    with pytest.raises(UserError, match="embedding_init"):
        ArmsConfig(**SMALL, embedding_init="generic", naive_init_std=1.0)


# ----------------------------------------------------------------------------
# The CLM loss, on tensors


def loss_and_gradient(logits, targets):
    """clm_loss(logits, targets) and its gradient with respect to the logits."""
    logits = logits.detach().requires_grad_()
    loss = clm_loss(logits, targets)
    assert isinstance(loss, torch.Tensor), f"the loss is a tensor, for backward to run through: got {type(loss)}"
    assert loss.shape == (), f"the loss is one number, a 0-dim tensor: got shape {tuple(loss.shape)}"
    loss.backward()
    return loss, logits.grad


@pytest.mark.parametrize(
    "B, T, V",
    [
        pytest.param(1, 1, 7, id="B=1, T=1"),
        pytest.param(3, 7, 13, id="B=3, T=7"),
        pytest.param(2, 5, 256, id="B=2, T=5, V=256"),
    ],
)
def test_clm_loss_is_the_mean_negative_log_likelihood_over_all_positions(B, T, V):
    """-log softmax(logits[b, t])[targets[b, t]], averaged over all B*T positions; its gradient in closed form."""
    torch.manual_seed(0)
    logits, targets = 3 * torch.randn(B, T, V), torch.randint(V, (B, T))
    z = logits.double()
    log_p = z - z.exp().sum(-1, keepdim=True).log()  # (B, T, V): log-softmax over the vocabulary
    nll = -log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T): each position's loss
    loss, grad = loss_and_gradient(logits, targets)
    assert loss.item() == pytest.approx(nll.mean().item(), rel=1e-5), (
        f"the loss is the mean over all B*T = {B * T} positions of -log softmax(logits[b, t])[targets[b, t]]: "
        f"expected {nll.mean().item():.6f}, got {loss.item():.6f} (their sum is {nll.sum().item():.6f})"
    )
    want = (log_p.exp() - F.one_hot(targets, V)) / (B * T)  # d mean / d logits = (softmax - one_hot) / (B*T)
    assert grad is not None and torch.allclose(grad.double(), want, atol=1e-6), (
        "the loss's gradient with respect to the logits is (softmax - one_hot(targets)) / (B*T): "
        + (
            "got none: the loss is cut off from the logits"
            if grad is None
            else f"largest difference {(grad.double() - want).abs().max().item():.2e}"
        )
    )


def test_clm_loss_scores_a_perfect_predictor_zero():
    """The targets are already the next tokens (next_batch shifted them): position t predicts targets[:, t]."""
    torch.manual_seed(0)
    B, T, V = 2, 6, 11
    targets = torch.randint(V, (B, T))
    logits = 30.0 * F.one_hot(targets, V).float()  # (B, T, V): all the mass on targets[b, t] at position t
    loss = clm_loss(logits, targets).item()
    assert loss == pytest.approx(0.0, abs=1e-6), (
        f"logits that put all the mass on targets[b, t] at position t score 0 (y is already shifted: shift "
        f"nothing again): got {loss:.3f}"
    )


@pytest.mark.parametrize("level", [0.0, 1000.0], ids=["logits=0", "logits=1000 (no overflow)"])
def test_clm_loss_of_uniform_logits_is_ln_v(level):
    B, T, V = 2, 3, 50
    targets = torch.randint(V, (B, T))
    loss = clm_loss(torch.full((B, T, V), level), targets).item()
    assert loss == pytest.approx(math.log(V), rel=1e-6), (
        f"equal logits ({level:g}) are a uniform guess and score ln V = {math.log(V):.6f} whatever their level "
        f"(the log-softmax subtracts the largest logit first): got {loss}"
    )


def test_clm_loss_of_a_confidently_wrong_prediction_is_its_margin():
    """All the mass on a wrong token, m = 200 above the rest: the loss is log(e^m + V - 1) ~ m, finite, though the
    target's probability e^-m underflows fp32 to 0 (so log(softmax) would give inf where log_softmax does not)."""
    torch.manual_seed(0)
    B, T, V, margin = 2, 3, 11, 200.0
    targets = torch.randint(V, (B, T))
    logits = margin * F.one_hot((targets + 1) % V, V).float()  # (B, T, V): every position sure of another token
    want = margin + math.log1p((V - 1) * math.exp(-margin))  # log(e^m + V - 1), written without overflow
    loss = clm_loss(logits, targets).item()
    assert loss == pytest.approx(want, rel=1e-6), (
        f"a prediction {margin:g} logits sure of the wrong token costs log(e^{margin:g} + V - 1) = {want:.6f}, a "
        f"finite loss (log_softmax, not the log of a softmax whose smallest probabilities underflow to 0): got {loss}"
    )


@pytest.mark.parametrize(
    "token", [0, 1, 50256, 50303], ids=["target 0", "target 1", "target 50256 (<|endoftext|>)", "target V-1"]
)
def test_clm_loss_counts_every_position_whatever_its_target(token):
    """No token id is set aside as padding: the document separator and token 0 are predicted like any other."""
    torch.manual_seed(0)
    B, T, V = 2, 3, 50304
    logits, targets = 3 * torch.randn(B, T, V), torch.randint(V, (B, T))
    targets[0, 0] = token  # one position aims at this token
    log_p = logits.double().log_softmax(-1)  # (B, T, V)
    nll = -log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T): each position's loss
    loss = clm_loss(logits, targets).item()
    assert loss == pytest.approx(nll.mean().item(), rel=1e-5), (
        f"the loss is the mean over all B*T = {B * T} positions, the one whose target is token {token} included: "
        f"expected {nll.mean().item():.6f}, got {loss:.6f} (the mean without that position: "
        f"{nll.flatten()[1:].mean().item():.6f})"
    )


def test_clm_loss_is_fp32_from_bf16_logits():
    """Under bf16 autocast the logits come in bf16; the log-softmax sums V exponentials, so it runs in fp32."""
    torch.manual_seed(0)
    B, T, V = 4, 16, 50304
    logits, targets = (3 * torch.randn(B, T, V)).bfloat16(), torch.randint(V, (B, T))
    loss = clm_loss(logits, targets)
    assert loss.dtype == torch.float32, f"the loss is fp32 whatever the logits' dtype: got {loss.dtype}"
    want = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()).item()
    assert loss.item() == pytest.approx(want, rel=1e-5), (
        f"the loss is computed in fp32 from the bf16 logits (not in bf16 and then converted): expected {want:.6f}, "
        f"got {loss.item():.6f}"
    )


def test_config_errors_name_the_values():
    with pytest.raises(ValueError, match="n_embd 130 is not divisible by n_head 4"):
        GPTConfig(n_embd=130, n_head=4)
    with pytest.raises(ValueError, match="norm 'batchnorm'"):
        GPTConfig(norm="batchnorm")
    with pytest.raises(ValueError, match="naive_init_std -1"):
        ArmsConfig(naive_init_std=-1)
    with pytest.raises(ValueError, match="norm 'none' must be rmsnorm or layernorm"):
        GPTConfig(norm="none")  # an arm's (arms.py), not the lesson's GPT's


def test_counts_and_generate():
    torch.manual_seed(0)
    gpt_config = GPTConfig(**SMALL)
    model = GPT(gpt_config)
    C, L, V, T = gpt_config.n_embd, gpt_config.n_layer, gpt_config.vocab_size, gpt_config.block_size
    assert model.num_params() == V * C + T * C + L * (12 * C * C + 2 * C) + C
    out = generate(model, torch.zeros(2, 1, dtype=torch.long), 40, temperature=0.9, top_k=10)
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
