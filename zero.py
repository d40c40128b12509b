"""ZeRO, by hand: the data-parallel ranks share out the training state instead of each holding all of it
(Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", the
engine of DeepSpeed).

Plain data parallelism (parallel.DataParallel) keeps all 16 bytes per parameter on each of the dp ranks:
fp32 weights (4), gradients (4) and AdamW's two moments (8). Yet a rank needs the moments only of the
parameters it updates, and the averaged gradient only where it updates. ZeRO cuts every gradient bucket
(DataParallel's buckets, in backward order) into dp equal shards, and rank r owns shard r:

    a bucket, flat, padded to a multiple of dp:   [ shard 0 | shard 1 | ... | shard dp-1 ]

  stage 1  backward fills the bucket as in DataParallel; a reduce-scatter, in place of the all-reduce,
           leaves on each rank the sum of its own shard; each rank runs AdamW on its shard only, so it
           keeps the moments of 1/dp of the parameters; an all-gather then copies every rank's updated
           shard into every rank's weights.                           4 + 4 + 8/dp bytes per parameter
  stage 2  the gradient, too, is kept only as the rank's shard: when a bucket is complete it is copied
           into a flat buffer that is reduce-scattered and dropped.   4 + 12/dp bytes per parameter
  (stage 3 shards the weights too and gathers them layer by layer before use: that is FSDP,
   torch_engines.py's --dp_mode fsdp.)

A ring reduce-scatter and a ring all-gather each move (dp - 1)/dp of the bucket, as the two halves of a
ring all-reduce do: stages 1 and 2 cost no more communication than plain DP. Under gradient accumulation
both keep the full gradient until the last micro-batch and reduce once (DeepSpeed's stage 2 reduces every
micro-batch instead, to hold only the shard throughout, for that many more reduce-scatters).

The weights become views into one flat buffer per bucket, so the all-gather writes them in place. AdamW
updates *pieces*: where a parameter meets this rank's shard, a contiguous range of it, so each piece
keeps its parameter's weight-decay group (ShardedAdamW). Checkpoints stay in single-device form:
state_by_parameter gathers every parameter's moments whole (checkpoint.py does the rest), so a ZeRO run
resumes on any layout, with or without ZeRO, and the reverse.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

from comm_count import counted
from parallel import DataParallel, flat_views


class ZeroDataParallel(DataParallel):
    """DataParallel with the gradients reduce-scattered into shards (stage 1, 2) and kept only as shards
    (stage 2). After the optimizer's update of the shards, gather_parameters() rebuilds the whole weights."""

    shards_gradients = True  # after finish(), a rank holds the averaged gradient of its shard only

    def __init__(self, model, group, size, rank, stage, bucket_mb=25.0, overlap=True):
        self.stage, self.rank = stage, rank
        super().__init__(model, group, size, "bucketed", bucket_mb, overlap)

    def new_flat(self, i):
        """A zeroed flat buffer for bucket i, padded to dp equal shards: (dp * shard numel,)."""
        p = self.buckets[i][0]
        return torch.zeros(-(-self.sizes[i] // self.size) * self.size, dtype=p.dtype, device=p.device)

    def shard_range(self, i):
        """[start, end) of this rank's shard of bucket i's flat buffer."""
        shard = -(-self.sizes[i] // self.size)
        return self.rank * shard, (self.rank + 1) * shard

    def make_gradient_buffers(self):
        """The weights moved into flat buffers; stage 1: DataParallel's flat gradient buffers, this rank's
        shard a view into each; stage 2: only a shard-sized gradient buffer per bucket. Then the pieces."""
        self.weights = [self.new_flat(i) for i in range(len(self.buckets))]  # (dp * shard,) each
        with torch.no_grad():
            for flat, bucket in zip(self.weights, self.buckets):
                for p, view in zip(bucket, flat_views(flat, bucket)):
                    view.copy_(p)
                    p.data = view  # the parameter now lives in the flat buffer the all-gather writes
        if self.stage == 1:
            super().make_gradient_buffers()
            self.shard_grads = [flat[slice(*self.shard_range(i))] for i, flat in enumerate(self.flats)]
        else:
            self.flats, self.views = [], []
            self.shard_grads = [
                torch.zeros_like(flat[slice(*self.shard_range(i))]) for i, flat in enumerate(self.weights)
            ]
            self.zero_buckets()
        # (parameter, bucket, where the piece starts in the parameter, in the shard, piece): the piece is a
        # Parameter viewing the weights' flat buffer, its .grad the matching view of the shard's gradient
        self.pieces = []
        for i, bucket in enumerate(self.buckets):
            start, end = self.shard_range(i)
            offset = 0
            for p in bucket:
                first, last = max(offset, start), min(offset + p.numel(), end)
                if first < last:
                    piece = nn.Parameter(self.weights[i][first:last])
                    piece.grad = self.shard_grads[i][first - start : last - start]
                    self.pieces.append((p, i, first - offset, first - start, piece))
                offset += p.numel()

    def pieces_of(self, params):
        """This rank's pieces of the given parameters: what AdamW updates in their place."""
        ids = {id(p) for p in params}
        return [piece for p, _, _, _, piece in self.pieces if id(p) in ids]

    def _launch(self, i):
        if self.stage == 1:
            flat = self.fill_bucket(i)  # the gradients are views into it
        else:  # copied into a flat buffer that lives until the reduce-scatter is done; the gradients go
            grads = [p.grad.flatten() if p.grad is not None else p.new_zeros(p.numel()) for p in self.buckets[i]]
            flat = self.new_flat(i)
            torch.cat(grads, out=flat[: self.sizes[i]])
            for p in self.buckets[i]:
                p.grad = None
        counted("dp", flat[: self.sizes[i]])  # the parameters' gradients; the padding (under dp elements) not
        shard = self.shard_grads[i]  # stage 1: this rank's range of flat itself (a reduce-scatter in place)
        self.launched[i] = (shard, flat, dist.reduce_scatter_single(shard, flat, group=self.group, async_op=True))

    def finish(self):
        """Block until this rank's shard of every bucket holds the DP average of its gradients."""
        for i in range(len(self.buckets)):
            if i not in self.launched:  # a bucket whose hooks did not all fire (an unused parameter)
                self._launch(i)
        for shard, _, work in self.launched.values():
            work.wait()
            shard /= self.size
        self.launched.clear()
        self.ready = [0] * len(self.buckets)

    def zero_buckets(self):
        """Zero every gradient for the next step: stage 1 as DataParallel (its shards are views into the
        buckets); stage 2: the shards, and the parameters' own gradients dropped."""
        if self.stage == 1:
            super().zero_buckets()
            return
        for shard in self.shard_grads:
            shard.zero_()
        for p in self.params:
            p.grad = None

    def gradients(self):
        """[(parameter, this rank's piece of its averaged gradient)]: the grad norm sums their squares over the
        DP group (parallel.global_grad_norm's sharded_over_dp)."""
        return [(p, piece.grad) for p, _, _, _, piece in self.pieces]

    def gather_parameters(self):
        """Every rank's updated shard into every rank's weights: an all-gather per bucket, in place."""
        works = []
        for i, flat in enumerate(self.weights):
            counted("dp", flat[: self.sizes[i]])
            shard = flat[slice(*self.shard_range(i))]
            works.append(dist.all_gather_single(flat, shard, group=self.group, async_op=True))
        for work in works:
            work.wait()


class ShardedAdamW(torch.optim.AdamW):
    """AdamW over this rank's pieces of ZeRO's shards, in the groups of the parameters they come from.
    Each step ends by all-gathering the updated shards, so every rank's weights are whole again.

    groups: [(parameters, weight decay)], as run_setup.make_optimizer groups the whole parameters."""

    def __init__(self, zero, groups, **adamw):
        pieces = [{"params": zero.pieces_of(params), "weight_decay": decay} for params, decay in groups]
        super().__init__(pieces, **adamw)
        self.zero = zero

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        self.zero.gather_parameters()
        return loss

    def state_by_parameter(self):
        """{parameter: {"step", "exp_avg", "exp_avg_sq"}} for every parameter of the DP engine, its moments
        all-gathered whole from the ranks' pieces: what AdamW without ZeRO holds. {} before the first step.
        Every DP rank must call it."""
        zero = self.zero
        if not self.state:
            return {}
        whole = {p: {"step": next(iter(self.state.values()))["step"].clone()} for p in zero.params}
        for key in ("exp_avg", "exp_avg_sq"):
            for i, (bucket, flat) in enumerate(zip(zero.buckets, zero.weights)):
                start, end = zero.shard_range(i)
                shard = torch.zeros(end - start, dtype=flat.dtype, device=flat.device)
                for _, piece_bucket, _, in_shard, piece in zero.pieces:
                    if piece_bucket == i:
                        shard[in_shard : in_shard + piece.numel()] = self.state[piece][key]
                gathered = torch.empty_like(flat)
                dist.all_gather_single(gathered, shard, group=zero.group)
                for p, view in zip(bucket, flat_views(gathered, bucket)):
                    whole[p][key] = view
        return whole

    def load_state_by_parameter(self, moments, param_groups):
        """The inverse of state_by_parameter: each piece takes its range of its parameter's moments.
        param_groups: the hyperparameters of the two groups (a single-device state dict's)."""
        index = {piece: i for i, piece in enumerate(q for group in self.param_groups for q in group["params"])}
        state = {}
        for p, _, in_param, _, piece in self.zero.pieces:
            if p in moments:
                state[index[piece]] = {
                    key: value.flatten()[in_param : in_param + piece.numel()] if value.dim() > 0 else value
                    for key, value in moments[p].items()
                }
        ours = self.state_dict()["param_groups"]
        self.load_state_dict(
            {"state": state, "param_groups": [dict(g, params=o["params"]) for g, o in zip(param_groups, ours)]}
        )
