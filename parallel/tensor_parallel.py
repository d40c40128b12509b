"""Tensor parallelism written by hand on torch.distributed, after Megatron-LM (Shoeybi et al. 2019,
arXiv:1909.08053): Megatron's f and g, the column- and row-parallel Linear, the embedding and the
loss cut by vocabulary, and `tensor_parallel`, which cuts a single-device GPT into this rank's slices.

Every layer takes its TP group as an argument; the process grid that makes the groups is in
grid.py, and ShardedModel (layout.py) and PipelineModel (pipeline.py) call tensor_parallel. Sequence
parallelism (Megatron-SP) cuts what TP leaves whole along the sequence: its section is below the layers.

    torchrun --standalone --nproc_per_node=2 train.py --tp 2          # one layer's matrices on 2 processes
"""

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from parallel.comm_count import counted

# ----------------------------------------------------------------------------
# Cutting a Linear layer, and the two communications it needs (f and g)
#
# A Linear layer Y = X W^T can be cut two ways across the tp ranks of a group:
# by output features (column parallel: each rank computes some columns of Y from
# the whole X) or by input features (row parallel: each rank holds some columns
# of X and computes a partial Y that the group sums). Column then row needs no
# communication in between, so each MLP and each attention costs one all-reduce
# forward (g, after the row-parallel layer) and one backward (f, before the
# column-parallel one): 2 all-reduces per block forward, 2 backward.


class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward, all-reduce backward. Each rank's column-parallel layer sends
    back a partial gradient for the replicated input; the whole gradient is their sum."""

    @staticmethod
    def forward(ctx, x, group):
        # exercise tp_layers, CopyToTensorParallel.forward: begin
        ctx.group = group
        return x
        # exercise tp_layers, CopyToTensorParallel.forward: end

    @staticmethod
    def backward(ctx, grad):
        # exercise tp_layers, CopyToTensorParallel.backward: begin
        grad = grad.contiguous()
        dist.all_reduce(counted("tp", grad), group=ctx.group)
        return grad, None
        # exercise tp_layers, CopyToTensorParallel.backward: end


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce forward, identity backward. The row-parallel partial outputs sum to
    the whole output; its gradient is the same whole gradient on every rank."""

    @staticmethod
    def forward(ctx, x, group):
        # exercise tp_layers, ReduceFromTensorParallel.forward: begin
        x = x.contiguous()
        dist.all_reduce(counted("tp", x), group=group)
        return x
        # exercise tp_layers, ReduceFromTensorParallel.forward: end

    @staticmethod
    def backward(ctx, grad):
        # exercise tp_layers, ReduceFromTensorParallel.backward: begin
        return grad, None
        # exercise tp_layers, ReduceFromTensorParallel.backward: end


@dataclass(frozen=True)
class Cut:
    """How a tensor-parallel parameter is cut from its single-device tensor: into tp equal
    slices along `dim`. With sections, that dim holds stacked blocks of those sizes (q, k, v;
    under GQA k and v narrower than q; SwiGLU's gate and up), each block cut separately, so
    every rank gets matching heads of q, k and v. With rows set, dim 0 (the vocabulary) is
    first padded with zero rows from `rows` up to a multiple of tp."""

    dim: int
    sections: tuple = ()  # the stacked blocks' sizes along dim; (): one block
    rows: int | None = None

    def shard(self, full, grid):
        """This rank's slice of the single-device tensor (no communication)."""
        tp = grid.tp
        if self.rows is not None:
            full = F.pad(full, (0, 0, 0, -(-self.rows // tp) * tp - full.shape[0]))  # (V, C) -> (V padded, C)
        blocks = full.split(list(self.sections), dim=self.dim) if self.sections else [full]
        return torch.cat([b.chunk(tp, dim=self.dim)[grid.tp_rank] for b in blocks], dim=self.dim).contiguous()

    def unshard(self, local, grid):
        """The single-device tensor, all-gathered from the TP group's slices: the inverse of shard."""
        shards = [torch.empty_like(local) for _ in range(grid.tp)]
        dist.all_gather(shards, local.detach().contiguous(), group=grid.tp_group)
        return self.join(shards)

    def join(self, shards):
        """The single-device tensor from the tp slices, in rank order."""
        local = [size // len(shards) for size in self.sections] or [shards[0].shape[self.dim]]
        pieces = [s.split(local, dim=self.dim) for s in shards]  # each shard's slice of each block
        full = torch.cat([torch.cat([p[b] for p in pieces], dim=self.dim) for b in range(len(local))], dim=self.dim)
        return full[: self.rows]  # drop the padding rows, if any


def _sharded_parameter(full, cut, grid):
    return nn.Parameter(cut.shard(full.detach(), grid))


class ColumnParallelLinear(nn.Module):
    """Y = X W^T with W cut by output features (rows of W):

        W = [W_1; W_2; ...; W_tp]    rank i holds W_i: (out/tp, in)
        Y = [X W_1^T, ..., X W_tp^T]  rank i computes its columns Y_i: (B, T, out/tp)

    X must be the same on every rank; its gradient is summed across ranks by f.
    The bias, if any, is cut like the rows of W.
    """

    f = CopyToTensorParallel  # the input's collective (sequence parallelism's: an all-gather)

    def __init__(self, weight, bias, group, cut):
        super().__init__()
        self.weight, self.bias, self.group, self.cut = weight, bias, group, cut

    @classmethod
    def from_linear(cls, linear, grid, sections=()):
        cut = Cut(dim=0, sections=sections)
        bias = None if linear.bias is None else _sharded_parameter(linear.bias, cut, grid)
        return cls(_sharded_parameter(linear.weight, cut, grid), bias, grid.tp_group, cut)

    def forward(self, x):  # (B, T, in) -> (B, T, out/tp)
        # exercise tp_layers, ColumnParallelLinear.forward: begin
        return F.linear(self.f.apply(x, self.group), self.weight, self.bias)
        # exercise tp_layers, ColumnParallelLinear.forward: end


class RowParallelLinear(nn.Module):
    """Y = X W^T with W cut by input features (columns of W):

    W = [W_1, W_2, ..., W_tp]     rank i holds W_i: (out, in/tp)
    X = [X_1, X_2, ..., X_tp]     rank i holds X_i: (B, T, in/tp), a column-parallel output
    Y = sum_i X_i W_i^T           partial products, summed by g; the bias is whole, added once, after
    """

    cut = Cut(dim=1)
    g = ReduceFromTensorParallel  # the output's collective (sequence parallelism's: a reduce-scatter)

    def __init__(self, weight, bias, group):
        super().__init__()
        self.weight, self.bias, self.group = weight, bias, group

    @classmethod
    def from_linear(cls, linear, grid):
        return cls(_sharded_parameter(linear.weight, cls.cut, grid), linear.bias, grid.tp_group)

    def forward(self, x):  # (B, T, in/tp) -> (B, T, out)
        # exercise tp_layers, RowParallelLinear.forward: begin
        y = self.g.apply(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias
        # exercise tp_layers, RowParallelLinear.forward: end


class VocabParallelEmbedding(nn.Module):
    """The token embedding cut by vocabulary: rank i holds rows [i V/tp, (i+1) V/tp) of the
    vocabulary padded to a multiple of tp. A rank looks up the ids it owns, writes zeros
    for the others, and the all-reduce (g) fills in every row from its owner."""

    g = ReduceFromTensorParallel  # the output's collective (sequence parallelism's: a reduce-scatter)

    def __init__(self, embedding, grid):
        super().__init__()
        self.cut = Cut(dim=0, rows=embedding.weight.shape[0])
        self.weight, self.group = _sharded_parameter(embedding.weight, self.cut, grid), grid.tp_group  # (V/tp, C)
        self.start = grid.tp_rank * self.weight.shape[0]
        self.end = self.start + self.weight.shape[0]  # may pass V: padding rows, never looked up

    def forward(self, idx):  # (B, T) -> (B, T, C)
        outside = (idx < self.start) | (idx >= self.end)
        local = F.embedding((idx - self.start).masked_fill(outside, 0), self.weight)
        return self.g.apply(local.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits cut by vocabulary, (B, T, V/tp) per rank, without ever
    building the full (B, T, V): three all-reduces of (B, T) numbers instead.

        loss = log sum_v exp(z_v) - z_target
             = m + log sum_ranks sum_local exp(z_v - m) - z_target,   m = max over all ranks

    Forward and backward side by side: d loss / d z_v = softmax(z)_v - [v == target],
    each rank for its own slice of v.
    """

    @staticmethod
    def forward(ctx, logits, targets, start, vocab_size, group):
        ctx.dtype = logits.dtype
        logits = logits.float()  # the sums below in fp32
        ids = start + torch.arange(logits.shape[-1], device=logits.device)
        logits = logits.masked_fill(ids >= vocab_size, -math.inf)  # padding rows: probability 0
        global_max = logits.max(dim=-1).values  # (B, T)
        dist.all_reduce(counted("tp", global_max), op=dist.ReduceOp.MAX, group=group)
        shifted = logits - global_max.unsqueeze(-1)  # (B, T, V/tp)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)  # (B, T)
        dist.all_reduce(counted("tp", sum_exp), group=group)
        local_target = targets - start
        owned = (local_target >= 0) & (local_target < logits.shape[-1])
        picked = shifted.gather(-1, local_target.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        target_logit = picked.masked_fill(~owned, 0.0)  # (B, T), nonzero on the owning rank only
        dist.all_reduce(counted("tp", target_logit), group=group)
        loss = sum_exp.log() - target_logit  # (B, T)
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local_target, owned)
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, local_target, owned = ctx.saved_tensors
        grad_logits = softmax.clone()  # (B, T, V/tp)
        rows = owned.nonzero(as_tuple=True)
        grad_logits[(*rows, local_target[rows])] -= 1.0
        return (grad_logits * (grad / local_target.numel())).to(ctx.dtype), None, None, None, None


class VocabParallelLoss(nn.Module):
    """The model's loss layer (model.CLMLoss) cut by vocabulary like the head it follows: the CLM
    loss of this rank's logits (B, T, V/tp), which hold vocabulary ids [start, start + V/tp)."""

    def __init__(self, start, vocab_size, group):
        super().__init__()
        self.start, self.vocab_size, self.group = start, vocab_size, group

    def forward(self, logits, targets):  # (B, T, V/tp), (B, T) -> ()
        return VocabParallelCrossEntropy.apply(logits, targets, self.start, self.vocab_size, self.group)


# ----------------------------------------------------------------------------
# Sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198; --sequence_parallel)
#
# TP leaves the norms, dropout and residual adds whole: every TP rank holds the same (B, T, C) there, and keeps
# it for backward. Sequence parallelism cuts those regions along the sequence instead, T/tp positions a rank.
# g's all-reduce after a row-parallel layer becomes a reduce-scatter (the sum, each rank keeping its positions),
# and f before a column-parallel layer an all-gather (the positions put back together, as attention and the MLP
# need every one): the same bytes on a ring, as an all-reduce is a reduce-scatter and then an all-gather. The
# parameters those regions use whole (norms, learned positions, row-parallel biases) each see T/tp positions on a
# rank, so their gradients are summed over the TP group.


def all_gather_sequence(x, group):
    """(B, T/tp, C) from each rank -> (B, T, C), the ranks' positions in rank order."""
    local = x.transpose(0, 1).contiguous()  # (T/tp, B, C): the collective joins along dim 0
    whole = torch.empty((dist.get_world_size(group) * local.shape[0], *local.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_single(counted("tp", whole), local, group=group)  # counted: the whole buffer, as ZeRO's
    return whole.transpose(0, 1).contiguous()  # (B, T, C), as the layers after expect


def reduce_scatter_sequence(x, group):
    """(B, T, C) partial sums on each rank -> (B, T/tp, C), this rank's positions of their sum."""
    whole = x.transpose(0, 1).contiguous()  # (T, B, C)
    local = torch.empty(
        (whole.shape[0] // dist.get_world_size(group), *whole.shape[1:]), dtype=x.dtype, device=x.device
    )
    dist.reduce_scatter_single(local, counted("tp", whole), group=group)
    return local.transpose(0, 1).contiguous()


class GatherFromSequenceParallel(torch.autograd.Function):
    """f under sequence parallelism: all-gather forward; reduce-scatter backward, as each rank's column-parallel
    layer sends back a partial gradient for every position, of which this rank keeps the sum of its own."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_sequence(grad, ctx.group), None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """g under sequence parallelism: reduce-scatter forward; all-gather backward, as every position's gradient
    flows back into every rank's partial product."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_sequence(grad, ctx.group), None


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """A column-parallel Linear whose input arrives cut by position: (B, T/tp, in) -> (B, T, out/tp)."""

    f = GatherFromSequenceParallel


class SequenceParallelRowLinear(RowParallelLinear):
    """A row-parallel Linear whose output leaves cut by position: (B, T, in/tp) -> (B, T/tp, out). Its whole bias
    is added to this rank's positions only: its gradient is summed over the group (sum_over_tp)."""

    g = ReduceScatterToSequenceParallel


class SequenceParallelEmbedding(VocabParallelEmbedding):
    """The vocabulary-parallel embedding whose sum leaves cut by position: (B, T) -> (B, T/tp, C)."""

    g = ReduceScatterToSequenceParallel


class SequenceParallelPositions(nn.Module):
    """Learned positions (GPT-2's wpe) for this rank's T/tp positions: GPT.forward asks for all T and adds them to
    the embedding's (B, T/tp, C). The table stays whole on every rank; each rank's gradient holds its rows."""

    def __init__(self, positions, grid):
        super().__init__()
        self.weight, self.tp, self.tp_rank = positions.weight, grid.tp, grid.tp_rank  # the same Parameter: wpe.weight

    def forward(self, pos):  # (T,) -> (T/tp, C)
        return F.embedding(pos.chunk(self.tp)[self.tp_rank], self.weight)


def sum_over_tp(parameter, group):
    """Sum the parameter's gradient over the TP group as backward produces it, before any DP engine's hooks see it:
    a parameter used whole on T/tp positions a rank gets the gradient of all T."""

    def summed(grad):
        grad = grad.clone()
        dist.all_reduce(counted("tp", grad), group=group)
        return grad

    parameter.register_hook(summed)


def tensor_parallel(model, grid, sequence_parallel=False):
    """Cut a single-device GPT across the TP group, in place, from its own initialization (same seed, same math):
    attention by heads (q, k, v column parallel, output projection row parallel; under GQA each rank takes
    n_kv_head / tp key/value heads, those its query heads read; the attention told this rank's head counts), the MLP
    column then row (SwiGLU's gate and up cut alike), the embedding, the head (the tied embedding's slice, or an
    untied head's) and the loss by vocabulary. Norm weights and position embeddings stay whole on every rank.

    Returns {parameter name: Cut} for every parameter that is now a slice: what gathering
    a checkpoint and the global grad norm need to know. A group of one cuts nothing: {}.

    sequence_parallel: the regions between the cut layers hold T/tp positions a rank (the layers above)."""
    if grid.tp == 1:
        return {}
    column, row, embedding = (
        (SequenceParallelColumnLinear, SequenceParallelRowLinear, SequenceParallelEmbedding)
        if sequence_parallel
        else (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)
    )
    C, kv = model.config.n_embd, model.config.kv_width
    mlp_sections = (model.config.hidden,) * 2 if model.config.arch == "llama" else ()  # SwiGLU: gate, up
    for block in model.blocks:
        block.attn.c_attn = column.from_linear(block.attn.c_attn, grid, (C, kv, kv))  # heads h*H/tp...
        block.attn.n_head, block.attn.n_kv_head = block.attn.n_head // grid.tp, block.attn.n_kv_head // grid.tp
        block.attn.c_proj = row.from_linear(block.attn.c_proj, grid)
        block.mlp.c_fc = column.from_linear(block.mlp.c_fc, grid, mlp_sections)
        block.mlp.c_proj = row.from_linear(block.mlp.c_proj, grid)
    head = model.lm_head.weight
    model.wte = embedding(model.wte, grid)
    if model.config.tie_embeddings:  # tied: the same slice scores
        model.lm_head = column(model.wte.weight, None, grid.tp_group, model.wte.cut)
    else:  # an untied head: its own matrix, cut by vocabulary as the loss reads it
        model.lm_head = column(_sharded_parameter(head, model.wte.cut, grid), None, grid.tp_group, model.wte.cut)
    model.clm_loss = VocabParallelLoss(model.wte.start, model.config.vocab_size, grid.tp_group)
    if sequence_parallel and model.wpe is not None:
        model.wpe = SequenceParallelPositions(model.wpe, grid)
    cut_of = {}  # parameter -> its cut (parameters hash by identity)
    for module in model.modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)):
            cut_of[module.weight] = module.cut
            if isinstance(module, ColumnParallelLinear) and module.bias is not None:
                cut_of[module.bias] = module.cut  # a row-parallel bias stays whole
    if sequence_parallel:  # norms, positions, row-parallel biases: whole, each rank's gradient from its positions
        for p in model.parameters():
            if p not in cut_of:
                sum_over_tp(p, grid.tp_group)
    return {name: cut_of[p] for name, p in model.named_parameters() if p in cut_of}
