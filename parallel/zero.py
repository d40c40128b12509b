"""ZeRO, by hand: the data-parallel ranks share out the training state instead of each holding all of it
(Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", the
engine of DeepSpeed).

    torchrun --standalone --nproc_per_node=2 train.py --dp 2 --zero 1 --batch_size 8   # AdamW's moments shared out
    torchrun --standalone --nproc_per_node=2 train.py --dp 2 --zero 2 --batch_size 8   # the gradients too

Plain data parallelism (data_parallel.BucketedDataParallel) keeps all 16 bytes per parameter on each of the dp ranks:
fp32 weights (4), gradients (4) and AdamW's two moments (8). Yet a rank needs the moments only of the
parameters it updates, and the averaged gradient only where it updates. ZeRO cuts every gradient bucket
(BucketedDataParallel's buckets, in backward order) into dp equal shards, and rank r owns shard r:

    a bucket, flat, padded to a multiple of dp:   [ shard 0 | shard 1 | ... | shard dp-1 ]

  stage 1  backward fills the bucket as in BucketedDataParallel; a reduce-scatter, in place of the all-reduce,
           leaves on each rank the sum of its own shard; each rank runs AdamW on its shard only, so it
           keeps the moments of 1/dp of the parameters; an all-gather then copies every rank's updated
           shard into every rank's weights.                           4 + 4 + 8/dp bytes per parameter
  stage 2  the gradient, too, is kept only as the rank's shard: when backward completes a bucket, its
           gradients are copied into a flat buffer that is reduce-scattered and dropped, at most two
           buckets in flight. Under gradient accumulation every micro-batch is reduced so (as DeepSpeed
           does), one reduce-scatter per micro-batch.                 4 + 12/dp bytes per parameter
  (stage 3 shards the weights too and gathers them layer by layer before use: that is FSDP,
   machinery/job/torch_engines.py's --dp_mode fsdp.)

A ring reduce-scatter and a ring all-gather each move (dp - 1)/dp of the bucket, as the two halves of a
ring all-reduce do: stage 1, and stage 2 without accumulation, cost no more communication than plain DP.
Stage 2 does not combine with a pipeline (layout.py refuses it): a stage's backward runs once per
micro-batch inside the schedule, so its whole gradient piles up until the schedule ends anyway.

The weights become views into one flat buffer per bucket, so the all-gather writes them in place. AdamW
updates *pieces*: where a parameter meets this rank's shard, a contiguous range of it, so each piece
keeps its parameter's weight-decay group (ShardedAdamW). Checkpoints stay in single-device form:
ShardedAdamW.moments() gathers every parameter's moments whole (checkpoint.py does the rest), so a ZeRO run
resumes on any layout, with or without ZeRO, and the reverse.

One class per stage: Zero1DataParallel, BucketedDataParallel with a reduce-scatter, and Zero2DataParallel, which
keeps no whole gradient; each holds what both share, a ShardedBuckets, and answers from it alike (ZeroStage).
"""

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn

from parallel.comm_count import counted
from parallel.data_parallel import BucketedDataParallel, Buckets, DataParallel
from parallel.optimizer import AdamW


class Piece(NamedTuple):
    """Where a parameter meets this rank's shard of its bucket: what AdamW updates in the parameter's place."""

    parameter: nn.Parameter  # the model's
    bucket: int
    in_parameter: int  # where the piece starts in the flattened parameter
    in_shard: int  # ... and in this rank's shard
    weights: nn.Parameter  # a view into the bucket's flat weights; its .grad a view into the shard's gradient


class ShardedBuckets:
    """What ZeRO's two stages share, whichever way they keep the gradients: the buckets (data_parallel.Buckets),
    each cut into dp equal shards (rank r owns shard r); the weights moved into one flat buffer per bucket, so that
    after the optimizer's update of the shards gather_parameters() rebuilds them whole, in place; and the pieces
    AdamW updates, each piece's gradient a view into shard_grads, the stage's [bucket i's shard of the averaged
    gradient: (shard numel,)]."""

    def __init__(self, buckets, grid, shard_grads):
        self.buckets, self.group, self.rank, self.shard_grads = buckets, grid.dp_group, grid.dp_rank, shard_grads
        self.weights = [buckets.new_flat(i) for i in range(len(buckets))]  # (dp * shard,) each
        with torch.no_grad():
            for i, flat in enumerate(self.weights):
                for p, view in zip(buckets.params[i], buckets.views(flat, i)):
                    view.copy_(p)
                    p.data = view  # the parameter now lives in the flat buffer the all-gather writes
        self.pieces = []
        for i, bucket in enumerate(buckets.params):
            start, end = self.rank * buckets.shard_numel[i], (self.rank + 1) * buckets.shard_numel[i]
            offset = 0
            for p in bucket:
                first, last = max(offset, start), min(offset + p.numel(), end)
                if first < last:
                    weights = nn.Parameter(self.weights[i][first:last])
                    weights.grad = shard_grads[i][first - start : last - start]
                    self.pieces.append(Piece(p, i, first - offset, first - start, weights))
                offset += p.numel()

    def pieces_of(self, params):
        """This rank's pieces of the given parameters: what AdamW updates in their place."""
        ids = {id(p) for p in params}
        return [piece.weights for piece in self.pieces if id(piece.parameter) in ids]

    def gather_parameters(self):
        """Every rank's updated shard into every rank's weights: an all-gather per bucket, in place."""
        works = []
        for i, flat in enumerate(self.weights):
            whole = counted_numel("dp", flat, self.buckets.sizes[i])
            shard = self.buckets.shard(flat, i, self.rank)
            works.append(dist.all_gather_single(whole, shard, group=self.group, async_op=True))
        for work in works:
            work.wait()


class ZeroStage:
    """The small base of ZeRO's two stages: what each answers from its ShardedBuckets (self.shards)."""

    def optimizer(self, groups, **options):
        """AdamW over this rank's pieces of the parameters, in their groups [(parameters, weight decay)]."""
        return ShardedAdamW(self.shards, groups, **options)

    def gradients(self):
        """[(parameter, this rank's piece of its averaged gradient)]: the grad norm sums their squares over the
        DP group (optimizer.global_grad_norm's sharded_over_dp)."""
        return [(piece.parameter, piece.weights.grad) for piece in self.shards.pieces]


class Zero1DataParallel(ZeroStage, BucketedDataParallel):
    """ZeRO stage 1: the gradients as in BucketedDataParallel (views into one flat buffer per bucket, here padded
    to dp equal shards); a reduce-scatter in place of the all-reduce leaves in this rank's shard of each bucket the
    average of that shard, which is all its AdamW reads."""

    def __init__(self, module, grid, overlap=True, bucket_mb=25.0):
        super().__init__(module, grid, overlap, bucket_mb, shards=grid.dp)
        shard_grads = [self.buckets.shard(flat, i, grid.dp_rank) for i, flat in enumerate(self.flats)]
        self.shards = ShardedBuckets(self.buckets, grid, shard_grads)  # views into the flat gradients

    def _launch(self, i):
        flat = self.fill_bucket(i)  # the gradients are views into it
        shard = self.shards.shard_grads[i]  # this rank's range of flat itself: a reduce-scatter in place
        work = dist.reduce_scatter_single(
            shard, counted_numel("dp", flat, self.buckets.sizes[i]), group=self.group, async_op=True
        )
        self.launched[i] = (shard, work)  # BucketedDataParallel.finish waits for it and divides the shard


class Zero2DataParallel(ZeroStage, DataParallel):
    """ZeRO stage 2: the gradient, too, is kept only as the rank's shard. When backward completes a
    bucket, its gradients are copied into a flat buffer that is reduce-scattered and dropped, at most
    two buckets in flight; under gradient accumulation every micro-batch is reduced so (as DeepSpeed does),
    so no_sync() holds nothing back."""

    def __init__(self, module, grid, overlap=True, bucket_mb=25.0):
        super().__init__(module, grid)
        self.buckets = Buckets(self.params, bucket_mb, shards=grid.dp)
        shard_grads = [b[0].new_zeros(n) for b, n in zip(self.buckets.params, self.buckets.shard_numel)]
        self.shards = ShardedBuckets(self.buckets, grid, shard_grads)  # no whole flat gradient is kept
        self.in_flight = []  # (bucket, received shard, the flat copy it came from, work), oldest first
        self.clear_gradients()  # and the ready counts at 0
        if overlap:  # else (a pipeline stage) every bucket is launched in finish()
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, param):
        i = self.buckets.index[param]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets.params[i]):
            self._launch(i)

    def _launch(self, i):
        # the gradients are copied out into a flat buffer and dropped; the buffer lives until its
        # reduce-scatter is done, and at most two buckets' buffers are in flight
        flat = self.buckets.new_flat(i)
        for p, view in zip(self.buckets.params[i], self.buckets.views(flat, i)):
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = None
        received = torch.empty_like(self.shards.shard_grads[i])
        work = dist.reduce_scatter_single(
            received, counted_numel("dp", flat, self.buckets.sizes[i]), group=self.group, async_op=True
        )
        self.in_flight.append((i, received, flat, work))
        self.ready[i] = 0  # the next micro-batch counts afresh
        while len(self.in_flight) > 2:
            self._land(self.in_flight.pop(0))

    def _land(self, reduced):
        """Add a finished reduce-scatter's average into its bucket's shard; its flat copy goes."""
        i, received, _, work = reduced
        work.wait()
        self.shards.shard_grads[i] += received / self.size

    def finish(self):
        """Block until this rank's shard of every bucket holds the DP average of its gradients."""
        for i, bucket in enumerate(self.buckets.params):
            if any(p.grad is not None for p in bucket):  # not launched (unused parameters, or no hooks)
                self._launch(i)
        while self.in_flight:
            self._land(self.in_flight.pop(0))
        self.ready = [0] * len(self.buckets)

    def clear_gradients(self):
        """Zero every gradient for the next step: the shards, and the parameters' own gradients dropped."""
        for _, _, _, work in self.in_flight:  # reduce-scatters of backwards that take no step (a timing)
            work.wait()
        self.in_flight.clear()
        self.ready = [0] * len(self.buckets)
        for shard in self.shards.shard_grads:
            shard.zero_()
        for p in self.params:
            p.grad = None


def counted_numel(dimension, flat, numel):
    """flat, its first numel elements counted (comm_count.counted): the parameters' gradients, not the padding
    after them, which the closed form does not count (under dp elements per bucket)."""
    counted(dimension, flat[:numel])
    return flat


class ShardedAdamW(AdamW):
    """AdamW over this rank's pieces of ZeRO's shards (a ShardedBuckets), in the groups of the parameters they come
    from. Each step ends by all-gathering the updated shards (a step post-hook, registered first), so every
    rank's weights are whole again before any other hook or the next forward sees them.

    groups: [(parameters, weight decay)], as run_setup.make_optimizer groups the whole parameters (through
    ZeroStage.optimizer)."""

    def __init__(self, shards, groups, **adamw):
        pieces = [{"params": shards.pieces_of(params), "weight_decay": decay} for params, decay in groups]
        super().__init__(pieces, **adamw)
        self.shards = shards
        self.register_step_post_hook(lambda *_: shards.gather_parameters())

    def moments(self):
        """{parameter: {"step", "exp_avg", "exp_avg_sq"}} for every parameter of the DP engine, its moments
        all-gathered whole from the ranks' pieces: what AdamW without ZeRO holds. {} before the first step.
        Every DP rank must call it (a rank whose shards are all padding holds no piece, and joins in)."""
        shards, buckets = self.shards, self.shards.buckets
        step = torch.zeros(1, device=shards.weights[0].device)  # the step count, from a rank that has pieces
        for state in self.state.values():
            step = state["step"].reshape(1).to(step)
        dist.all_reduce(step, op=dist.ReduceOp.MAX, group=shards.group)
        if step.item() == 0:
            return {}
        # each parameter its own 0-dim step, as AdamW keeps it: one shared tensor would be counted up once per
        # parameter by the AdamW that loads it
        whole = {p: {"step": step.reshape(()).clone()} for p in buckets.index}
        for key in ("exp_avg", "exp_avg_sq"):
            for i, flat in enumerate(shards.weights):
                shard = flat.new_zeros(buckets.shard_numel[i])
                for piece in shards.pieces:
                    if piece.bucket == i:
                        shard[piece.in_shard : piece.in_shard + piece.weights.numel()] = self.state[piece.weights][key]
                gathered = torch.empty_like(flat)
                dist.all_gather_single(gathered, shard, group=shards.group)
                for p, view in zip(buckets.params[i], buckets.views(gathered, i)):
                    whole[p][key] = view
        return whole

    def load_moments(self, moments, param_groups):
        """The inverse of moments(), without communication: each piece takes its range of its parameter's moments."""
        super().load_moments(self.pieces_state(moments), param_groups)

    def pieces_state(self, moments):
        """{piece: its range of its parameter's moments}, each a copy (a view would keep the whole moment alive; a
        shared step would count up twice)."""
        return {
            piece.weights: {
                key: (
                    value.flatten()[piece.in_parameter : piece.in_parameter + piece.weights.numel()]
                    if value.dim()
                    else value
                ).clone()
                for key, value in moments[piece.parameter].items()
            }
            for piece in self.shards.pieces
            if piece.parameter in moments
        }
