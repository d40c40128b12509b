"""Parallelism written by hand on torch.distributed: the process grid and data parallelism.

The same code runs as a simulation on one CPU (gloo over loopback) and for
real on GPUs (NCCL), started by torchrun:

    torchrun --standalone --nproc_per_node=2 train.py --dp 2          # 2 processes on this machine

Data parallelism (DP): every rank holds the whole model, reads its own share
of each batch, and before the shared update the group averages gradients
with all-reduce, so every rank takes the identical step. Tensor (TP) and
pipeline (PP) parallelism cut the model itself; the grid below already
places ranks for all three (3D parallelism).
"""

import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ParallelConfig:
    dp: int = 1  # data-parallel ranks: model copies, each reading its share of every batch
    tp: int = 1  # tensor-parallel ranks: one layer's matrices cut across them
    pp: int = 1  # pipeline stages: consecutive blocks on consecutive ranks
    dp_mode: str = "bucketed"  # bucketed (async all-reduce overlapped with backward) | naive (one per parameter after it)
    bucket_mb: float = 25.0  # gradient bucket size for the bucketed mode
    dist_timeout: int = 300  # seconds a collective waits for a missing rank before the run stops with an error
    micro_batches: int = 1  # pipeline: each batch_size batch is cut into this many micro-batches
    schedule: str = "1f1b"  # pipeline schedule: gpipe (all forwards, then all backwards) | 1f1b


# ----------------------------------------------------------------------------
# Start-up: torchrun's environment, read in this one place


@dataclass
class Launch:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: str = "auto"  # cuda:LOCAL_RANK under torchrun on GPUs


def init_distributed(timeout_seconds):
    """Join the process group that torchrun set up (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a plain `python train.py` has none
    of these and runs as rank 0 of 1 with no process group.

    Backend nccl on CUDA, gloo on CPU. On CPU each rank gets cores / local ranks
    threads: two ranks with two threads each on two cores run 2.5x slower than
    with one each, as they fight over the cores.
    """
    if "WORLD_SIZE" not in os.environ:
        return Launch()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", f"cuda:{local_rank}"
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
        backend, device = "gloo", "cpu"
    if world_size > 1:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_seconds))
    return Launch(rank, world_size, local_rank, device)


def destroy_distributed():
    if dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------
# The process grid


class ProcessGrid:
    """World ranks laid out as a (dp, pp, tp) grid, tp varying fastest:

        rank = (dp_rank * pp + pp_rank) * tp + tp_rank

    so a TP group is tp consecutive ranks, which torchrun puts on one node: TP
    talks at every layer and needs the fast links inside a machine; PP talks
    only between stages; DP once per step. Each rank belongs to one group per
    dimension; every rank creates every group (torch.distributed requires it)
    and keeps its own.
    """

    def __init__(self, dp, tp, pp, rank=0, world_size=1):
        for name, size in (("dp", dp), ("tp", tp), ("pp", pp)):
            if size < 1:
                raise ValueError(f"--{name} {size} must be at least 1")
        if dp * tp * pp != world_size:
            raise ValueError(
                f"dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} but WORLD_SIZE = {world_size}: "
                f"launch {dp * tp * pp} processes (torchrun --nproc_per_node) or change --dp/--tp/--pp"
            )
        self.dp, self.tp, self.pp, self.rank, self.world_size = dp, tp, pp, rank, world_size
        self.dp_rank, rest = divmod(rank, pp * tp)
        self.pp_rank, self.tp_rank = divmod(rest, tp)
        layout = torch.arange(world_size).view(dp, pp, tp)
        self.dp_ranks = layout[:, self.pp_rank, self.tp_rank].tolist()
        self.pp_ranks = layout[self.dp_rank, :, self.tp_rank].tolist()
        self.tp_ranks = layout[self.dp_rank, self.pp_rank, :].tolist()
        self.dp_group = self.tp_group = self.pp_group = self.embedding_group = None
        if world_size > 1:
            self.dp_group = self._make_groups([layout[:, p, t] for p in range(pp) for t in range(tp)])
            self.pp_group = self._make_groups([layout[d, :, t] for d in range(dp) for t in range(tp)])
            self.tp_group = self._make_groups([layout[d, p, :] for d in range(dp) for p in range(pp)])
        if pp > 1:  # the first and last stages share the tied embedding / output head
            self.embedding_group = self._make_groups([layout[d, [0, -1], t] for d in range(dp) for t in range(tp)])
        # pipeline neighbours (world ranks), None at the ends
        self.pp_prev = self.pp_ranks[self.pp_rank - 1] if self.pp_rank > 0 else None
        self.pp_next = self.pp_ranks[self.pp_rank + 1] if self.pp_rank < pp - 1 else None

    def _make_groups(self, rank_lists):
        mine = None
        for ranks in rank_lists:
            group = dist.new_group(ranks.tolist())
            if self.rank in ranks.tolist():
                mine = group
        return mine

    def __repr__(self):
        return (f"ProcessGrid(rank {self.rank}/{self.world_size}: dp {self.dp_rank}/{self.dp}, "
                f"pp {self.pp_rank}/{self.pp}, tp {self.tp_rank}/{self.tp})")


def all_reduce_mean(value, group, size):
    """Mean of a tensor over a group (gloo has no AVG op: SUM, then divide)."""
    if size > 1:
        dist.all_reduce(value, group=group)
        value /= size
    return value


# ----------------------------------------------------------------------------
# Data parallelism


class DataParallel:
    """Average gradients over the data-parallel group, by hand.

    At start, every rank takes DP rank 0's parameters (a broadcast), so all
    copies begin identical; with identical averaged gradients they stay so.

    bucketed (the default): parameters are grouped, in roughly the order
    backward produces their gradients (last layers first), into buckets of
    about bucket_mb. A post-accumulate-grad hook counts the gradients that
    are ready; when a bucket is complete it is flattened and its all-reduce
    launched asynchronously, so communication overlaps the rest of backward:

        backward:  [blocks L..k grads] [blocks k..1 grads] [embeddings]
        network:              [all-reduce bucket 0] [bucket 1]   [bucket 2]

    finish() waits for them and writes the averages back. naive: after
    backward, one blocking all-reduce per parameter (kept to compare against).

    Under gradient accumulation only the last micro-batch syncs
    (`sync = False` before the others): the sum of local gradients is
    averaged once, which equals averaging each micro-batch.
    """

    def __init__(self, model, group, size, mode="bucketed", bucket_mb=25.0, overlap=True):
        if mode not in ("bucketed", "naive"):
            raise ValueError(f"--dp_mode {mode!r}: choose bucketed or naive")
        self.group, self.size, self.mode = group, size, mode
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied matrix appears once
        source = dist.get_global_rank(group, 0)
        for p in self.params:
            dist.broadcast(p.data, src=source, group=group)
        self.sync = True
        self.buckets, bucket, bucket_bytes = [], [], 0
        for p in reversed(self.params):  # backward meets the last layers first
            bucket.append(p)
            bucket_bytes += p.numel() * p.element_size()
            if bucket_bytes >= bucket_mb * 2**20:
                self.buckets.append(bucket)
                bucket, bucket_bytes = [], 0
        if bucket:
            self.buckets.append(bucket)
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.ready = [0] * len(self.buckets)
        self.in_flight = {}  # bucket index -> (flat gradient, async work handle)
        # A pipeline stage runs backward once per micro-batch, so gradients are complete only
        # at the end of the schedule: there (overlap=False) every bucket is launched in finish().
        if mode == "bucketed" and overlap:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, param):
        if not self.sync:
            return
        i = self.bucket_of[param]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i):
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]])
        self.in_flight[i] = (flat, dist.all_reduce(flat, group=self.group, async_op=True))

    def finish(self):
        """Block until every gradient is the DP average; call after the last backward of a step."""
        if self.mode == "naive":
            for p in self.params:
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.group)
                    p.grad /= self.size
            return
        for i, bucket in enumerate(self.buckets):
            if i not in self.in_flight:  # a bucket whose hooks did not all fire (an unused parameter)
                for p in bucket:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                self._launch(i)
        for i, (flat, work) in self.in_flight.items():
            work.wait()
            flat /= self.size
            offset = 0
            for p in self.buckets[i]:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        self.in_flight.clear()
        self.ready = [0] * len(self.buckets)


# ----------------------------------------------------------------------------
# Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053)
#
# A Linear layer Y = X W^T can be cut two ways across the tp ranks of a group:
# by output features (column parallel: each rank computes some columns of Y from
# the whole X) or by input features (row parallel: each rank holds some columns
# of X and computes a partial Y that the group sums). Column then row needs no
# communication in between, so each MLP and each attention costs one all-reduce
# forward (g, after the row-parallel layer) and one backward (f, before the
# column-parallel one): 2 all-reduces per block forward, 2 backward.

# Bytes all-reduced by the TP operators, by direction: read by bench/tp_speed.py.
tp_traffic = {"forward": 0, "backward": 0}


def _all_reduce_counted(x, group, direction):
    tp_traffic[direction] += x.numel() * x.element_size()
    dist.all_reduce(x, group=group)
    return x


class CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward, all-reduce backward. Each rank's column-parallel layer sends
    back a partial gradient for the replicated input; the whole gradient is their sum."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce_counted(grad.contiguous(), ctx.group, "backward"), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce forward, identity backward. The row-parallel partial outputs sum to
    the whole output; its gradient is the same whole gradient on every rank."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce_counted(x.contiguous(), group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def shard(full, dim, chunks, tp, tp_rank):
    """This rank's slice of a full tensor cut in tp parts along dim. With chunks > 1 the
    dim holds that many stacked blocks (q, k, v) and each block is cut separately."""
    blocks = full.chunk(chunks, dim=dim)
    return torch.cat([b.chunk(tp, dim=dim)[tp_rank] for b in blocks], dim=dim).contiguous()


def unshard(shards, dim, chunks):
    """Inverse of shard: the full tensor from the tp slices, in rank order."""
    pieces = [s.chunk(chunks, dim=dim) for s in shards]
    return torch.cat([torch.cat([p[c] for p in pieces], dim=dim) for c in range(chunks)], dim=dim)


def _sharded_parameter(full, dim, chunks, grid):
    p = nn.Parameter(shard(full.detach(), dim, chunks, grid.tp, grid.tp_rank))
    p.tp_split = (dim, chunks)  # marks the parameter as this rank's slice; how to reassemble it
    return p


def _padded_rows(tensor, rows):
    """tensor with zero rows appended up to `rows` (dim 0)."""
    return F.pad(tensor, (0, 0, 0, rows - tensor.shape[0]))


class ColumnParallelLinear(nn.Module):
    """Y = X W^T with W cut by output features (rows of W):

        W = [W_1; W_2; ...; W_tp]    rank i holds W_i: (out/tp, in)
        Y = [X W_1^T, ..., X W_tp^T]  rank i computes its columns Y_i: (B, T, out/tp)

    X must be the same on every rank; its gradient is summed across ranks by f.
    """

    def __init__(self, weight, bias, group):
        super().__init__()
        self.weight, self.bias, self.group = weight, bias, group

    @classmethod
    def from_linear(cls, linear, grid, chunks=1):
        bias = None if linear.bias is None else _sharded_parameter(linear.bias, 0, chunks, grid)
        return cls(_sharded_parameter(linear.weight, 0, chunks, grid), bias, grid.tp_group)

    def forward(self, x):  # (B, T, in) -> (B, T, out/tp)
        return F.linear(CopyToTensorParallel.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Y = X W^T with W cut by input features (columns of W):

        W = [W_1, W_2, ..., W_tp]     rank i holds W_i: (out, in/tp)
        X = [X_1, X_2, ..., X_tp]     rank i holds X_i: (B, T, in/tp), a column-parallel output
        Y = sum_i X_i W_i^T           partial products, summed by g; the bias is added once, after
    """

    def __init__(self, weight, bias, group):
        super().__init__()
        self.weight, self.bias, self.group = weight, bias, group

    @classmethod
    def from_linear(cls, linear, grid):
        return cls(_sharded_parameter(linear.weight, 1, 1, grid), linear.bias, grid.tp_group)

    def forward(self, x):  # (B, T, in/tp) -> (B, T, out)
        y = ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """The token embedding cut by vocabulary: rank i holds rows [i V/tp, (i+1) V/tp).
    A rank looks up the ids it owns, writes zeros for the others, and the all-reduce (g)
    fills in every row from its owner."""

    def __init__(self, weight, grid):
        super().__init__()
        self.weight, self.group = weight, grid.tp_group
        self.start = grid.tp_rank * weight.shape[0]
        self.end = self.start + weight.shape[0]  # may pass V: padding rows, never looked up

    def forward(self, idx):  # (B, T) -> (B, T, C)
        outside = (idx < self.start) | (idx >= self.end)
        local = F.embedding((idx - self.start).masked_fill(outside, 0), self.weight)
        return ReduceFromTensorParallel.apply(local.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


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
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - global_max.unsqueeze(-1)  # (B, T, V/tp)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)  # (B, T)
        dist.all_reduce(sum_exp, group=group)
        local_target = targets - start
        owned = (local_target >= 0) & (local_target < logits.shape[-1])
        picked = shifted.gather(-1, local_target.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        target_logit = picked.masked_fill(~owned, 0.0)  # (B, T), nonzero on the owning rank only
        dist.all_reduce(target_logit, group=group)
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


def tensor_parallel(model, grid):
    """Cut a single-device GPT across the TP group, in place, from its own initialization
    (same seed, same math): attention by heads (q, k, v column parallel, output projection
    row parallel), the MLP column then row, the tied embedding / head and the loss by
    vocabulary. Norm weights and position embeddings stay whole on every rank."""
    cfg, tp = model.config, grid.tp
    check_tensor_parallel_layout(cfg, tp)
    V = cfg.vocab_size
    padded_vocab = -(-V // tp) * tp  # V rounded up to a multiple of tp
    for block in model.blocks:
        block.attn.c_attn = ColumnParallelLinear.from_linear(block.attn.c_attn, grid, chunks=3)  # heads h*H/tp...
        block.attn.c_proj = RowParallelLinear.from_linear(block.attn.c_proj, grid)
        block.mlp.c_fc = ColumnParallelLinear.from_linear(block.mlp.c_fc, grid)
        block.mlp.c_proj = RowParallelLinear.from_linear(block.mlp.c_proj, grid)
    vocab_slice = _sharded_parameter(_padded_rows(model.wte.weight, padded_vocab), 0, 1, grid)  # (V/tp, C)
    vocab_slice.tp_rows = V  # the padding rows are dropped when the full matrix is gathered
    model.wte = VocabParallelEmbedding(vocab_slice, grid)
    model.lm_head = ColumnParallelLinear(vocab_slice, None, grid.tp_group)  # tied: the same slice scores
    start, group = model.wte.start, grid.tp_group
    model.clm_loss = lambda logits, targets: VocabParallelCrossEntropy.apply(logits, targets, start, V, group)
    return model


def global_grad_norm(parameters, grid=None):
    """L2 norm of all gradients of the whole model, the sum of squares in fp32.
    A parameter sliced across the TP group holds part of that sum, so the slices'
    squares are summed over the group; a whole (replicated) one counts once. Each
    pipeline stage holds different parameters: their sums add up over the PP group
    (the last stage's copy of the tied embedding is not counted again)."""
    grads = [(p.grad.detach().float(), hasattr(p, "tp_split")) for p in parameters
             if p.grad is not None and not getattr(p, "pp_duplicate", False)]
    device = grads[0][0].device if grads else None
    sliced = sum((g.pow(2).sum() for g, is_slice in grads if is_slice), torch.zeros((), device=device))
    whole = sum((g.pow(2).sum() for g, is_slice in grads if not is_slice), torch.zeros((), device=device))
    if grid is not None and grid.tp > 1:
        dist.all_reduce(sliced, group=grid.tp_group)
    total = sliced + whole
    if grid is not None and grid.pp > 1:
        dist.all_reduce(total, group=grid.pp_group)
    return torch.sqrt(total)


def check_tensor_parallel_layout(cfg, tp):
    """Before any process group work: a layout that cannot be cut is named, not hung on.
    Heads are the unit of the cut (n_embd = n_head x head size, so n_embd follows); the
    vocabulary never blocks it, as it is padded to a multiple of tp."""
    if tp < 1 or cfg.n_head % tp:
        raise ValueError(f"n_head {cfg.n_head} is not divisible by tp {tp}: choose --tp among the divisors "
                         f"of n_head, or --n_head a multiple of {tp} (with --n_embd a multiple of it)")


def gather_full(tensor, param, grid):
    """The whole tensor of which `tensor` is this rank's slice, cut as `param` is (tensor is
    param itself, or shaped like it, as an AdamW moment); a copy if param is whole.
    Every TP rank must call it."""
    if not hasattr(param, "tp_split") or grid.tp == 1:
        return tensor.detach()
    shards = [torch.empty_like(tensor) for _ in range(grid.tp)]
    dist.all_gather(shards, tensor.detach().contiguous(), group=grid.tp_group)
    return unshard(shards, *param.tp_split)[: getattr(param, "tp_rows", None)]


def take_slice(full, param, grid):
    """This rank's slice of a whole tensor, cut as param is: the inverse of gather_full."""
    if not hasattr(param, "tp_split") or grid.tp == 1:
        return full
    if hasattr(param, "tp_rows"):
        full = _padded_rows(full, param.shape[0] * grid.tp)
    return shard(full, *param.tp_split, grid.tp, grid.tp_rank)


def full_state_dict(model, grid):
    """The single-device state dict of a (possibly) tensor-parallel model."""
    return {name: gather_full(p, p, grid) for name, p in model.state_dict(keep_vars=True).items()}


def load_full_state_dict(model, full, grid):
    """Load a single-device state dict into a (possibly) tensor-parallel model: each rank takes its slices."""
    model.load_state_dict({name: take_slice(full[name], p, grid) for name, p in model.state_dict(keep_vars=True).items()})


def full_optimizer_state_dict(optimizer, grid):
    """AdamW's state dict with every moment gathered whole, as a single-device run would save it."""
    state = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state["state"] = {  # new dicts: state_dict() shares the live ones
        index: {key: gather_full(value, params[index], grid) if value.dim() > 0 else value
                for key, value in moments.items()}
        for index, moments in state["state"].items()
    }
    return state


def load_full_optimizer_state_dict(optimizer, full, grid):
    """Load a single-device AdamW state dict, each rank taking the slices of its parameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    local = dict(full, state={
        index: {key: take_slice(value, params[index], grid) if value.dim() > 0 else value
                for key, value in moments.items()}
        for index, moments in full["state"].items()
    })
    optimizer.load_state_dict(local)


# ----------------------------------------------------------------------------
# Coordination helpers for the training loop


def run_on_rank0(fn, is_rank0):
    """fn() on rank 0 only (writing files, preparing data); its result, or the ValueError
    it raised, then reaches every rank, so no rank waits forever for a failed rank 0."""
    result, error = None, None
    if is_rank0:
        try:
            result = fn()
        except ValueError as e:
            error = str(e)
    if dist.is_initialized():
        box = [(result, error)]
        dist.broadcast_object_list(box, src=0)
        result, error = box[0]
    if error is not None:
        raise ValueError(error)
    return result
