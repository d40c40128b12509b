"""A GPT language model: token + position embeddings, n_layer transformer blocks, tied output head.

Follows GPT-2 (Radford et al. 2019) as nanoGPT writes it, with the stability choices of modern pretraining: Pre-LN
blocks, RMSNorm (Zhang & Sennrich 2019), no biases, width-scaled initialization; LayerNorm with biases where a preset
claims GPT-2. The loss is the causal language modelling (CLM) loss: cross-entropy of each position's prediction of
the next token, in fp32. The counterfactuals the notebooks measure these choices against (Post-LN, no norm, a naive
init, attention written out) are machinery/job/arms.py's subclass of this GPT.

`--arch llama` is the family of today's small bases (Llama, SmolLM2, Qwen2.5), sharing the rest: rotary positions
(`apply_rope`), grouped-query attention (`--n_kv_head`: fewer key/value heads, each shared by a group of query heads),
a SwiGLU MLP (`SwiGLU`), and as options Qwen2.5's q/k/v biases and an untied output head (`--tie_embeddings false`).

Shapes: B batch, T sequence, C channels (n_embd), H heads, V vocab.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from errors import UserError


@dataclass
class GPTConfig:
    block_size: int = 128  # context length T
    vocab_size: int = 256  # V; a run pads the tokenizer's vocab up to a multiple of 64 (padded_vocab_size)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128  # C
    dropout: float = 0.0
    bias: bool = False  # biases in Linear and LayerNorm; GPT-2 had them, modern models drop them
    norm: str = "rmsnorm"  # rmsnorm | layernorm (GPT-2's, with bias)
    activation: str = "gelu"  # gelu (exact, erf) | gelu_tanh (GPT-2's tanh approximation of it)
    # gpt2: learned positions, a GELU MLP | llama: rotary positions, a SwiGLU MLP, grouped-query attention
    arch: str = "gpt2"
    n_kv_head: int = 0  # llama: key/value heads, each shared by n_head / n_kv_head query heads; 0 = n_head
    mlp_hidden: int = 0  # the MLP's hidden width; 0 = 4 C (gpt2), or 8 C / 3 up to a multiple of 64 (llama)
    rope_theta: float = 10000.0  # llama: the base of the rotary frequencies
    qkv_bias: bool = False  # llama: biases on q, k and v only (Qwen2.5 has them)
    tie_embeddings: bool = True  # the output head is the token embedding (false: a matrix of its own)
    rms_norm_eps: float = 1e-6  # RMSNorm's epsilon (Llama's bases use 1e-5; their weights expect theirs)
    NORMS: ClassVar = ("rmsnorm", "layernorm")

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise UserError(f"n_embd {self.n_embd} is not divisible by n_head {self.n_head}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.dropout < 1:
            raise UserError(f"dropout {self.dropout} must lie in [0, 1)")
        if self.norm not in self.NORMS:
            raise UserError(f"norm {self.norm!r} must be {' or '.join(self.NORMS)}")
        if self.activation not in ("gelu", "gelu_tanh"):
            raise UserError(f"activation {self.activation!r} must be gelu or gelu_tanh")
        if self.arch not in ("gpt2", "llama"):
            raise UserError(f"arch {self.arch!r} must be gpt2 or llama")
        if self.arch == "gpt2" and (self.n_kv_head not in (0, self.n_head) or self.qkv_bias):
            raise UserError("n_kv_head and qkv_bias are the llama arch's: pass --arch llama")
        if self.n_kv_head < 0 or self.n_head % self.kv_heads:
            raise UserError(f"n_kv_head {self.n_kv_head} must divide n_head {self.n_head} (0: one per query head)")
        if (self.n_embd // self.n_head) % 2 and self.arch == "llama":
            raise UserError(f"the head size {self.n_embd // self.n_head} must be even: rotary positions turn pairs")

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head

    @property
    def kv_width(self):
        """The keys' (and the values') width: kv_heads heads of n_embd / n_head channels, under GQA less than n_embd."""
        return self.kv_heads * (self.n_embd // self.n_head)

    @property
    def hidden(self):
        """The MLP's hidden width: 4 C for GELU; for SwiGLU, whose three matrices would otherwise hold 12 C^2, 8 C / 3
        (the same 8 C^2 as GELU's two) rounded up to a multiple of 64, as Llama does (to 256 there)."""
        if self.mlp_hidden:
            return self.mlp_hidden
        return 4 * self.n_embd if self.arch == "gpt2" else 64 * math.ceil(8 * self.n_embd / 3 / 64)


def padded_vocab_size(vocab_size):
    """vocab_size up to a multiple of 64, as a run builds its model: 50257 -> 50304."""
    # a (B T, C) @ (C, V) matmul is fastest when V is a multiple of 64; the extra ids are never targets
    return 64 * math.ceil(vocab_size / 64)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight. The mean of squares is summed in fp32 even under bf16."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).type_as(x)


def make_norm(gpt_config):
    if gpt_config.norm == "rmsnorm":
        return RMSNorm(gpt_config.n_embd, gpt_config.rms_norm_eps)
    elif gpt_config.norm == "layernorm":
        return nn.LayerNorm(gpt_config.n_embd, bias=gpt_config.bias)
    else:
        raise ValueError(f"unknown norm {gpt_config.norm!r}")


def grouped_heads(t, n_head):
    """Keys or values (B, kv_heads, S, C/H) with each head repeated for the n_head / kv_heads query heads it serves
    (grouped-query attention) -> (B, H, S, C/H); as they are when every query head has its own."""
    return t if t.size(1) == n_head else t.repeat_interleave(n_head // t.size(1), dim=1)


def causal_attention(q, k, v, dropout_p):
    """softmax(q k^T / sqrt(C/H) + causal mask) v, through PyTorch's fused kernel (flash attention
    where it has one): the (T, T) scores are never stored. q (B, H, T, C/H), k and v (B, kv_heads, S, C/H).

    Under bf16 autocast on a CPU it runs in fp32: there PyTorch's bf16 attention kernel is slower
    than its fp32 one at small head sizes, while the matmuls around it still gain from bf16
    (DESIGN.md, "Choices measured")."""
    k, v = grouped_heads(k, q.size(1)), grouped_heads(v, q.size(1))  # (B, H, S, C/H)
    # A KV cache's step brings one query, the newest position, against all S keys: it sees every one of them,
    # so no mask (is_causal would align its mask with the first key and hide all but that one).
    is_causal = q.size(-2) > 1
    if q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=is_causal, dropout_p=dropout_p
            )
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, dropout_p=dropout_p)


def rope_angles(head_dim, positions, theta):
    """(cos, sin), each (T, head_dim / 2), of the T positions (a (T,) tensor): position t turns the pair of
    channels (i, i + head_dim / 2) by the angle t · theta^(-2i / head_dim), fast turns in the first pairs, slow
    ones in the last (Su et al. 2021, "RoFormer")."""
    device = positions.device
    inverse_frequencies = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inverse_frequencies
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """x (B, H, T, D) with each channel pair (i, i + D/2) turned by its position's angle, in fp32. q k^T then
    depends on the positions of q and k only through their distance: rotations compose, R(a)^T R(b) = R(b - a).
    The pairs are a head's two halves, as Hugging Face's Llama lays them out, so its weights load as they are."""
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, H, T, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    # softmax(q k^T / sqrt(C/H) + causal mask) v: the one seam a variant replaces (machinery's arms.py's kernel written
    # out, context_parallel.py's ring); q (B, H, T, C/H), k and v (B, kv_heads, S, C/H)
    kernel = staticmethod(causal_attention)

    def __init__(self, gpt_config):
        super().__init__()
        self.head_dim = gpt_config.n_embd // gpt_config.n_head
        self.dropout = gpt_config.dropout
        self.n_head, self.n_kv_head = gpt_config.n_head, gpt_config.kv_heads  # tensor parallelism sets this rank's
        self.rope_theta = gpt_config.rope_theta if gpt_config.arch == "llama" else None  # None: learned positions
        qkv_bias = gpt_config.bias or gpt_config.qkv_bias  # q, k, v at once; under GQA k and v narrower than q
        self.c_attn = nn.Linear(gpt_config.n_embd, gpt_config.n_embd + 2 * gpt_config.kv_width, bias=qkv_bias)
        self.c_proj = nn.Linear(gpt_config.n_embd, gpt_config.n_embd, bias=gpt_config.bias)  # into the residual stream
        self.resid_dropout = nn.Dropout(gpt_config.dropout)

    def forward(self, x, cache=None):
        # q (B, T, n_head C/H), k and v (B, T, n_kv_head C/H) each: this rank's heads under tensor parallelism (and
        # under sequence parallelism c_attn gathers all T positions from x's T/tp)
        qkv = self.c_attn(x)
        B, T, _ = qkv.shape
        kv_width = self.n_kv_head * self.head_dim
        q, k, v = qkv.split((self.n_head * self.head_dim, kv_width, kv_width), dim=2)
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, H or kv_heads, T, C/H)
        if self.rope_theta is not None:  # rotary positions: q and k turned by their positions, v left alone
            start = 0 if cache is None else len(cache)  # a cache holds the positions before these T
            cos, sin = rope_angles(self.head_dim, self.positions(start, T, x.device), self.rope_theta)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:  # generating: these T positions' keys and values join those of the earlier ones
            k, v = cache.extend(k, v)  # (B, kv_heads, S, C/H): every position so far, these T the last
        y = self.kernel(q, k, v, self.dropout if self.training else 0.0)  # (B, H, T, C/H)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C): the heads side by side
        return self.resid_dropout(self.c_proj(y))

    def positions(self, start, T, device):
        """The (T,) positions of these queries in the sequence: start onwards (context parallelism: its own)."""
        return torch.arange(start, start + T, device=device)


class MLP(nn.Module):
    def __init__(self, gpt_config):
        super().__init__()
        self.c_fc = nn.Linear(gpt_config.n_embd, gpt_config.hidden, bias=gpt_config.bias)
        self.c_proj = nn.Linear(gpt_config.hidden, gpt_config.n_embd, bias=gpt_config.bias)  # the residual stream
        self.dropout = nn.Dropout(gpt_config.dropout)
        self.approximate = "tanh" if gpt_config.activation == "gelu_tanh" else "none"

    def forward(self, x):
        hidden = F.gelu(self.c_fc(x), approximate=self.approximate)  # (B, T, hidden) (under TP: hidden / tp)
        return self.dropout(self.c_proj(hidden))  # (B, T, C)


class SwiGLU(nn.Module):
    """Llama's MLP (Shazeer 2020, "GLU Variants Improve Transformer"): down(silu(gate(x)) * up(x)). The gate,
    a smooth switch per hidden unit, decides how much of the up-projection passes; three matrices of C x hidden,
    hidden ~ 8 C / 3, hold what GELU's two of C x 4 C do."""

    def __init__(self, gpt_config):
        super().__init__()
        # gate and up in one matrix, as q, k and v are: one input, so tensor parallelism needs one f for both
        self.c_fc = nn.Linear(gpt_config.n_embd, 2 * gpt_config.hidden, bias=gpt_config.bias)
        self.c_proj = nn.Linear(gpt_config.hidden, gpt_config.n_embd, bias=gpt_config.bias)  # the residual stream
        self.dropout = nn.Dropout(gpt_config.dropout)

    def forward(self, x):
        gate, up = self.c_fc(x).chunk(2, dim=-1)  # (B, T, hidden) each (under TP: this rank's hidden / tp)
        return self.dropout(self.c_proj(F.silu(gate) * up))  # (B, T, C)


class Block(nn.Module):
    """One transformer block: attention then MLP, each a residual branch. Pre-LN normalizes the branch input and
    leaves the residual stream x untouched, so gradients reach early layers through an identity path; Post-LN (the
    original Transformer, machinery/job/arms.py's PostLNBlock) normalizes after the sum and is known to need a careful
    warmup to train at depth (Xiong et al. 2020)."""

    def __init__(self, gpt_config):
        super().__init__()
        self.norm_1 = make_norm(gpt_config)
        self.attn = CausalSelfAttention(gpt_config)
        self.norm_2 = make_norm(gpt_config)
        self.mlp = SwiGLU(gpt_config) if gpt_config.arch == "llama" else MLP(gpt_config)

    def forward(self, x, cache=None):  # (B, T, C) -> (B, T, C); cache: this layer's KVCache when generating
        x = x + self.attn(self.norm_1(x), cache)
        return x + self.mlp(self.norm_2(x))


def clm_loss(logits, targets):
    """Mean cross-entropy of each position's next-token prediction: logits (B, T, V), targets (B, T).
    The log-softmax sums V exponentials: fp32 whatever the autocast dtype."""
    # exercise clm_loss: begin
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    # exercise clm_loss: end


class CLMLoss(nn.Module):
    """clm_loss as the model's last layer: tensor parallelism replaces it by its vocab-parallel
    twin (tensor_parallel.VocabParallelLoss), as it replaces the head whose logits it scores."""

    def forward(self, logits, targets):  # (B, T, V), (B, T) -> ()
        return clm_loss(logits, targets)


def run_blocks(blocks, x, recompute=False):
    """x (B, T, C) through the blocks in turn. recompute (activation recomputation, --recompute; Chen et al. 2016): a
    block keeps only its input for backward, which first runs the block's forward again to rebuild what it dropped.
    Per layer, backward then keeps 2 s b h bytes at 16 bits instead of about s b h (10 + 24/tp): memory bought with
    a second forward, a third more compute. The random generators are replayed: dropout draws the same mask twice."""
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False) if recompute and torch.is_grad_enabled() else block(x)
    return x


class GPT(nn.Module):
    # state_dict() lists the tied matrix under both names; named_parameters() only under the first
    TIED = {"lm_head.weight": "wte.weight"}

    def __init__(self, gpt_config):
        super().__init__()
        self.config = gpt_config
        self.wte = nn.Embedding(gpt_config.vocab_size, gpt_config.n_embd)  # token embedding, tied to the output head
        # learned absolute positions (gpt2); llama's rotary ones turn q and k inside attention instead
        self.wpe = nn.Embedding(gpt_config.block_size, gpt_config.n_embd) if gpt_config.arch == "gpt2" else None
        self.drop = nn.Dropout(gpt_config.dropout)
        self.blocks = nn.ModuleList(Block(gpt_config) for _ in range(gpt_config.n_layer))
        self.norm_f = make_norm(gpt_config)  # Pre-LN leaves the residual stream unnormalized: one last norm
        self.lm_head = nn.Linear(gpt_config.n_embd, gpt_config.vocab_size, bias=False)
        if gpt_config.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # tied: one (V, C) matrix reads tokens in and scores them out
        self.clm_loss = CLMLoss()  # a layer without parameters, cut by vocabulary under tensor parallelism
        self.recompute = False  # activation recomputation (run_blocks): how to train, not what the model is
        self.apply(self._init_weights)

    # Width-scaled initialization. sigma = init_std(C) = sqrt(2 / (5 C)): each Linear that reads the residual stream
    # then sums C inputs into an output of variance 2/5 (Nguyen & Salazar 2019, "small init"); at C = 768 it is
    # 0.023, close to GPT-2's fixed 0.02, and it shrinks as models widen.
    # - Residual output projections (attn.c_proj, mlp.c_proj): sigma / sqrt(2 n_layer). Each block adds two
    #   branches to the residual stream; scaling each by 1/sqrt(2 n_layer) keeps the stream's variance independent
    #   of depth (GPT-2).
    # - Tied embedding / output head: std = 0.25 / sqrt(C). As the head it scores a normalized hidden state of RMS 1,
    #   giving logits of std 0.25, so the first prediction is nearly uniform and the first loss is ~ln V + 0.03
    #   instead of far above it; as the embedding it is a small input that the first norm rescales.
    # - Position embedding: the same std as the token embedding it is added to. Norm weights 1, biases 0.
    # (machinery/job/arms.py's --naive_init_std replaces all of it by one std everywhere, to show what it buys.)
    @staticmethod
    def init_std(n_embd):
        return math.sqrt(2 / (5 * n_embd))

    @staticmethod
    def embedding_std(n_embd):
        return 0.25 / math.sqrt(n_embd)

    def _init_weights(self, module):
        # exercise init: begin
        C, L = self.config.n_embd, self.config.n_layer
        if isinstance(module, nn.Embedding) or (module is self.lm_head and not self.config.tie_embeddings):
            nn.init.normal_(module.weight, std=self.embedding_std(C))  # an untied head scores as the tied one
        elif isinstance(module, (CausalSelfAttention, MLP, SwiGLU)):
            nn.init.normal_(module.c_proj.weight, std=self.init_std(C) / math.sqrt(2 * L))
        elif isinstance(module, nn.Linear) and module is not self.lm_head:
            nn.init.normal_(module.weight, std=self.init_std(C))
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        # self.apply visits children first, so the c_proj rule above overwrites the generic Linear one.
        # exercise init: end

    def forward(self, idx, targets=None, cache=None):
        """idx (B, T) int64 -> logits (B, T, V); with targets (B, T), also the CLM loss (fp32 scalar). cache
        (generating only: sample.generate): one KVCache per block, the positions before idx; idx's join it."""
        B, T = idx.shape
        start = 0 if cache is None else len(cache[0])  # idx's first position: the cache's positions come before
        if start + T > self.config.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size {self.config.block_size}")
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:  # learned positions join the tokens here; rotary ones turn q and k in attention
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
        x = self.drop(x)
        if cache is None:
            x = run_blocks(self.blocks, x, self.recompute)
        else:  # each block attends over its layer's kept keys and values, and appends idx's
            for block, layer_cache in zip(self.blocks, cache):
                x = block(x, layer_cache)
        logits = self.lm_head(self.norm_f(x))  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, self.clm_loss(logits, targets)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # the tied matrix counts once
