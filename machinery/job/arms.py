"""The counterfactual arms the notebooks measure the chapter's defenses against: the GPT without them.

    python train.py --norm_position post        # Post-LN: norm(x + f(x)), the original Transformer's block
    python train.py --norm none                 # no normalization at all
    python train.py --naive_init_std 1.0        # one std for every matrix and embedding, no residual scaling
    python train.py --embedding_init generic    # the embeddings and head at the hidden matrices' std, not their own
    python train.py --attention manual          # attention written out, its (T, T) weights stored

model.py's GPT is the defended model only: Pre-LN blocks, a norm, the width-scaled init, PyTorch's fused attention
kernel. `ArmsConfig` is its configuration with the arms as fields (each a flag, recorded in run.json with the rest
of the model), and `ArmedGPT` the GPT built with them: the same modules and the same initial draws, its blocks,
norms, init or attention swapped where an arm asks. With every arm at its default it is the GPT, bitwise.
"""

import math
from dataclasses import asdict, dataclass, replace
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from errors import UserError
from model import GPT, Block, CausalSelfAttention, GPTConfig, grouped_heads


@dataclass
class ArmsConfig(GPTConfig):
    NORMS: ClassVar = (*GPTConfig.NORMS, "none")  # none: no normalization at all
    norm_position: str = "pre"  # pre (Pre-LN: x + f(norm(x))) | post (Post-LN: norm(x + f(x)))
    naive_init_std: float = 0.0  # 0: the width-scaled init (GPT._init_weights); > 0: N(0, std^2) everywhere
    embedding_init: str = "own"  # own: GPT.embedding_std | generic: the hidden matrices' GPT.init_std
    attention: str = "sdpa"  # sdpa: PyTorch's fused kernel | manual: written out, its (T, T) weights stored

    def __post_init__(self):
        super().__post_init__()
        if self.norm_position not in ("pre", "post"):
            raise UserError(f"norm_position {self.norm_position!r} must be pre or post")
        if self.naive_init_std < 0:
            raise UserError(f"naive_init_std {self.naive_init_std} must be 0 (width-scaled init) or positive")
        if self.embedding_init not in ("own", "generic"):
            raise UserError(f"embedding_init {self.embedding_init!r} must be own or generic")
        if self.embedding_init == "generic" and self.naive_init_std:
            raise UserError("--embedding_init generic and --naive_init_std: the naive init sets every std, drop one")
        if self.attention not in ("sdpa", "manual"):
            raise UserError(f"attention {self.attention!r} must be sdpa or manual")

    @classmethod
    def of(cls, gpt_config):
        """gpt_config as an ArmsConfig: as it is, or a GPTConfig with every arm at its default."""
        return gpt_config if isinstance(gpt_config, cls) else cls(**asdict(gpt_config))


def manual_causal_attention(q, k, v, dropout_p):
    """causal_attention written out, as a learner reads it: softmax(q k^T / sqrt(C/H) + causal mask) v, each
    attention weight dropped with probability dropout_p (the kept ones scaled by 1 / (1 - dropout_p)).
    q (B, H, T, C/H), k and v (B, kv_heads, T, C/H) -> (B, H, T, C/H) in v's dtype. It stores the (B, H, T, T)
    scores and weights that the fused kernel never does: memory grows with T^2. (Sampling with the KV cache passes
    one query, the newest token, against the S keys so far: scores (B, H, 1, S), the mask built from q's length
    hiding nothing.)

    The scores and their softmax are fp32 whatever the inputs' dtype, as in the fused kernels: a score near
    100 held in bf16 is off by up to 0.25, which moves its weight by up to 28%. (Under autocast the matmul
    itself runs in bf16, as do the model's other matmuls.)"""
    k, v = grouped_heads(k, q.size(1)), grouped_heads(v, q.size(1))  # (B, H, T, C/H)
    # exercise attention: begin
    T, head_size = q.size(-2), q.size(-1)
    # 1/sqrt(head size): q . k sums head_size products, so its spread grows like sqrt(head size)
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T): query t, key s
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)  # (T, T): True where s > t
    scores = scores.masked_fill(future, float("-inf"))  # exp(-inf) = 0: no weight on the future
    weights = F.softmax(scores, dim=-1)  # (B, H, T, T): over the keys s, each row sums to 1
    weights = F.dropout(weights, dropout_p)  # each weight dropped with probability p, the others scaled by 1/(1-p)
    return weights.to(v.dtype) @ v  # (B, H, T, C/H): each position's weighted sum of the values it sees
    # exercise attention: end


class ManualAttention(CausalSelfAttention):
    """The model's attention with its kernel written out (manual_causal_attention): the same function of the same
    weights, so either kernel resumes the other's run."""

    kernel = staticmethod(manual_causal_attention)


class PostLNBlock(Block):
    """Post-LN (the original Transformer's): each branch added to the stream, then the sum normalized. The stream
    itself passes through every norm, so early layers' gradients have no identity path (Xiong et al. 2020)."""

    def forward(self, x, cache=None):  # (B, T, C) -> (B, T, C)
        x = self.norm_1(x + self.attn(x, cache))
        return self.norm_2(x + self.mlp(x))


class ArmedGPT(GPT):
    """The GPT with the arms of an ArmsConfig: Post-LN blocks (and no final norm: the last block ends on one), no
    norms at all, a naive init, or attention written out. The modules are built, and drawn, as the GPT's; an arm
    then swaps what it changes, none of which draws a random number (norms start at 1 and 0)."""

    def __init__(self, gpt_config):
        arms = ArmsConfig.of(gpt_config)
        # the GPT's modules, with a norm where the arm has none (replaced below); the init draws as the config says
        super().__init__(replace(arms, norm="rmsnorm") if arms.norm == "none" else arms)
        self.config = arms
        for block in self.blocks:
            if arms.norm_position == "post":
                block.__class__ = PostLNBlock
            if arms.attention == "manual":
                block.attn.__class__ = ManualAttention
            if arms.norm == "none":
                block.norm_1, block.norm_2 = nn.Identity(), nn.Identity()
        if arms.norm_position == "post" or arms.norm == "none":
            self.norm_f = nn.Identity()

    def _init_weights(self, module):
        """--naive_init_std s > 0: one fixed std for every matrix and embedding, no residual scaling, the naive init
        whose failures (a first loss far above ln V, a residual stream that grows with depth) the notebooks measure;
        else the GPT's width-scaled init, with --embedding_init generic its embeddings and head at the hidden
        matrices' std instead of their own (logits of std ~0.63 at the start, not 0.25)."""
        naive, C = self.config.naive_init_std, self.config.n_embd
        if not naive:
            super()._init_weights(module)
            if self.config.embedding_init == "generic" and (
                isinstance(module, nn.Embedding) or (module is self.lm_head and not self.config.tie_embeddings)
            ):
                with torch.no_grad():  # the same draw rescaled: every other module draws as the GPT's does
                    module.weight.mul_(self.init_std(C) / self.embedding_std(C))
            return
        if isinstance(module, (nn.Embedding, nn.Linear)) and (
            module is not self.lm_head or not self.config.tie_embeddings
        ):
            nn.init.normal_(module.weight, std=naive)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


def check_arms(arms, layout):
    """Name an arm the layout cannot run (before any process group exists, as parallel.layout.check_layout does)."""
    if layout.cp > 1 and arms.attention != "sdpa":
        raise UserError(
            f"--cp {layout.cp} attends around its ring, not with --attention {arms.attention}: leave it out"
        )
