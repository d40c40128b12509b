"""Data parallelism by hand: every rank holds the whole model (or its TP slices, or its pipeline stage), reads its own
share of each batch, and before the shared update the group averages gradients with all-reduce, so every rank takes
the identical step. The optimizer whose moments checkpoints read per parameter, the engines that average (one
all-reduce per parameter, or buckets overlapped with backward), and the global gradient norm over every cut.
ZeRO's engines (zero.py) share the training state out over the same replicas instead.
"""

import contextlib

import torch
import torch.distributed as dist

from parallel.comm_count import counted

# ----------------------------------------------------------------------------
# The optimizer, its moments per parameter


class AdamW(torch.optim.AdamW):
    """torch's AdamW, giving and taking its moments per parameter: the one interface through which
    checkpoint.py reads and restores every optimizer (zero.ShardedAdamW gathers and cuts its shards
    behind the same two calls)."""

    def moments(self):
        """{parameter: {"step", "exp_avg", "exp_avg_sq"}} for every parameter this rank holds. {} before the
        first step. Every rank of the DP group must call it (ZeRO's gathers the moments over the group)."""
        return {p: self.state[p] for group in self.param_groups for p in group["params"] if p in self.state}

    def load_moments(self, moments, param_groups):
        """The inverse of moments(): {parameter: its AdamW state}, and the groups' hyperparameters
        (a state dict's "param_groups", in this optimizer's group order)."""
        index = {p: i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
        ours = self.state_dict()["param_groups"]  # the hyperparameters from the checkpoint, our parameter indices
        self.load_state_dict(
            {
                "state": {index[p]: state for p, state in moments.items()},
                "param_groups": [dict(g, params=o["params"]) for g, o in zip(param_groups, ours)],
            }
        )


def adamw(groups, **options):
    """AdamW over groups [(parameters, weight decay)]: what a rank updates when it holds its parameters whole."""
    return AdamW([{"params": params, "weight_decay": decay} for params, decay in groups], **options)


# ----------------------------------------------------------------------------
# Data parallelism


class DataParallel:
    """What every hand-written data-parallel engine shares: the replicas start identical, and the
    optimizer that updates them. NaiveDataParallel and BucketedDataParallel below average the
    gradients; ZeRO's engines (zero.py) share the training state out over the replicas instead.

    At start, every rank takes DP rank 0's whole module state (a broadcast of every parameter,
    trainable or frozen, and every buffer), so all copies begin identical, as torch's DDP makes them; with
    identical averaged gradients of the trainable ones they stay so (a buffer that forward changes would drift
    apart: DDP broadcasts buffers again before each forward, these engines only at the start). Under gradient
    accumulation only the last micro-batch syncs (`with dp.no_sync():` around the others, as with DDP): the sum of
    local gradients is averaged once, which equals averaging each micro-batch.
    """

    zero_stage = 0  # how much of the training state is shared out over the replicas (zero.py: 1 or 2)
    shards_gradients = False  # every rank holds every averaged gradient (under ZeRO, a shard of them)
    reduces_every_micro_batch = False  # under accumulation, only the last micro-batch (ZeRO-2 reduces each)

    def __init__(self, module, grid):
        self.group, self.size = grid.dp_group, grid.dp
        self.params = [p for p in module.parameters() if p.requires_grad]  # a tied matrix appears once
        source = dist.get_global_rank(self.group, 0)
        for tensor in [*module.parameters(), *module.buffers()]:  # a frozen bias or a buffer would stay apart
            dist.broadcast(tensor.data, src=source, group=self.group)
        self._sync = True  # False inside no_sync()

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside starts no all-reduce: the local gradients add up until a backward outside it."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def finish(self):
        """Block until every gradient this rank keeps is the DP average; call after the last backward of a step."""
        raise NotImplementedError  # each engine its own: the algorithm it is named for

    def clear_gradients(self):
        """After the update: the gradients cleared for the next step."""
        raise NotImplementedError

    def gradients(self):
        """[(parameter, its averaged gradient)] as this rank holds them after finish(): whole, every one."""
        return [(p, p.grad) for p in self.params if p.grad is not None]

    def optimizer(self, groups, **options):
        """The AdamW that updates this rank's parameters: groups [(parameters, weight decay)]."""
        return adamw(groups, **options)


class NaiveDataParallel(DataParallel):
    """After backward, one blocking all-reduce per parameter, then a division: the average, as
    simply as it can be written (kept to compare against the bucketed engine)."""

    def finish(self):
        """Block until every gradient is the DP average; call after the last backward of a step."""
        # exercise dp_average, NaiveDataParallel.finish: begin
        for p in self.params:
            if p.grad is not None:
                dist.all_reduce(counted("dp", p.grad), group=self.group)
                p.grad /= self.size
        # exercise dp_average, NaiveDataParallel.finish: end

    def clear_gradients(self):
        """Free every gradient; the next backward allocates them again."""
        for p in self.params:
            p.grad = None


class BucketedDataParallel(DataParallel):
    """The gradients averaged in buckets, each sent while backward still runs.

    Parameters are grouped, in roughly the order backward produces their gradients (last
    layers first), into buckets of about bucket_mb. Each bucket is one flat buffer and its
    parameters' gradients are views into it, so backward accumulates straight into the buffer
    that is sent: no copy in, no copy out. A post-accumulate-grad hook counts the gradients
    that are ready; when a bucket is complete its all-reduce is launched asynchronously, so
    communication overlaps the rest of backward:

        backward:  [blocks L..k grads] [blocks k..1 grads] [embeddings]
        network:              [all-reduce bucket 0] [bucket 1]   [bucket 2]

    finish() waits for them and divides by the group size: the gradients, views, are then the
    average. clear_gradients() zeroes the buffers in place.
    """

    def __init__(self, module, grid, overlap=True, bucket_mb=25.0):
        super().__init__(module, grid)
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
        self.sizes = [sum(p.numel() for p in b) for b in self.buckets]  # elements of each bucket's parameters
        self.make_gradient_buffers()
        self.ready = [0] * len(self.buckets)
        self.launched = {}  # bucket index -> (flat gradient, handle of its asynchronous all-reduce)
        # A pipeline stage runs backward once per micro-batch, so gradients are complete only
        # at the end of the schedule: there (overlap=False) every bucket is launched in finish().
        if overlap:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def make_gradient_buffers(self):
        """One flat buffer per bucket, each parameter's gradient a view into it."""
        self.flats = [self.new_flat(i) for i in range(len(self.buckets))]
        self.views = [flat_views(flat, b) for flat, b in zip(self.flats, self.buckets)]  # each parameter's gradient
        self.clear_gradients()

    def new_flat(self, i):
        """A zeroed flat buffer for bucket i: (its numel,)."""
        p = self.buckets[i][0]
        return torch.zeros(self.sizes[i], dtype=p.dtype, device=p.device)

    def _grad_ready(self, param):
        if not (self._sync or self.reduces_every_micro_batch):
            return
        i = self.bucket_of[param]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i):
        flat = self.fill_bucket(i)
        self.launched[i] = (flat, dist.all_reduce(counted("dp", flat), group=self.group, async_op=True))

    def fill_bucket(self, i):
        """Bucket i's flat buffer, every gradient of the bucket in it (they are views into it from here on)."""
        for p, view in zip(self.buckets[i], self.views[i]):
            if p.grad is None:  # an unused parameter, or a gradient someone set to None: a zero gradient
                view.zero_()
            elif p.grad is not view:  # replaced by a new tensor: back into the bucket
                view.copy_(p.grad)
            p.grad = view
        return self.flats[i]

    def clear_gradients(self):
        """Zero every gradient for the next step, in place: they stay views into the buckets."""
        for flat, bucket, views in zip(self.flats, self.buckets, self.views):
            flat.zero_()
            for p, view in zip(bucket, views):
                p.grad = view

    def finish(self):
        """Block until every gradient is the DP average; call after the last backward of a step."""
        # exercise dp_average, BucketedDataParallel.finish: begin
        for i in range(len(self.buckets)):
            if i not in self.launched:  # a bucket whose hooks did not all fire (an unused parameter)
                self._launch(i)
        for flat, work in self.launched.values():
            work.wait()
            flat /= self.size  # the gradients are views into flat: now each is the average
        self.launched.clear()
        self.ready = [0] * len(self.buckets)
        # exercise dp_average, BucketedDataParallel.finish: end


def zero_stage_of(dp):
    """The ZeRO stage of a DP engine (RankModel.zero_stage): 0 when there is none (dp is 1)."""
    return dp.zero_stage if dp is not None else 0


def flat_views(flat, params):
    """Each parameter's shape as a view into the flat buffer, in order (the buffer may be longer: padding)."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


def clear_gradients(module, dp):
    """After the update: every gradient cleared for the next step by the DP engine (bucketed: zeroed
    in place, as they are views into its buckets), or freed when there is none."""
    if dp is not None:
        dp.clear_gradients()
    else:
        module.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------
# The global gradient norm, over TP slices and pipeline stages


def global_grad_norm(sliced, whole, grid=None, sharded_over_dp=False, device=None):
    """L2 norm of the whole model's gradient, the sum of squares in fp32.

    sliced: this rank's gradients of tensor-parallel slices; their squares are summed
    over the TP group. whole: gradients every TP rank holds in full (norm weights,
    positions); they count once. Each pipeline stage holds other parameters, so the
    stages' sums add up over the PP group. sharded_over_dp (ZeRO): each DP rank holds
    its shard of the gradients, so both sums first add up over the DP group. device: where
    the sums live when this rank holds no gradient (NCCL reduces device tensors only)."""
    device = (sliced + whole)[0].device if sliced + whole else device

    def sum_of_squares(grads):  # one multi-tensor kernel instead of three small ops per gradient
        if not grads:
            return torch.zeros((), device=device)
        return torch.nn.utils.get_total_norm([g.detach().float() for g in grads], foreach=True).pow(2)

    sliced_sq, whole_sq = sum_of_squares(sliced), sum_of_squares(whole)
    if sharded_over_dp and grid.dp > 1:
        sums = torch.stack([sliced_sq, whole_sq])
        dist.all_reduce(sums, group=grid.dp_group)
        sliced_sq, whole_sq = sums
    if grid is not None and grid.tp > 1:
        dist.all_reduce(sliced_sq, group=grid.tp_group)
    total = sliced_sq + whole_sq
    if grid is not None and grid.pp > 1:
        dist.all_reduce(total, group=grid.pp_group)
    return torch.sqrt(total)


def sharded_grad_norm(local_parameters, grid, dp=None, skip=None):
    """global_grad_norm of the gradients of (single-device name, parameter, Cut or None) triples:
    a parameter with a Cut is a TP slice, one without is whole. dp: the data-parallel engine,
    which holds the averaged gradients (under ZeRO, this rank's shard of them). skip: a parameter
    not to count (a pipeline's second copy of the tied matrix)."""
    cut_of = {p: cut for _, p, cut in local_parameters}
    gradients = dp.gradients() if dp is not None else [(p, p.grad) for p in cut_of if p.grad is not None]
    grads = [(g, cut_of[p]) for p, g in gradients if p is not skip]
    sliced, whole = [g for g, cut in grads if cut is not None], [g for g, cut in grads if cut is None]
    device = local_parameters[0][1].device
    return global_grad_norm(sliced, whole, grid, dp is not None and dp.shards_gradients, device)


def forward_and_backward(forward, autocast, x, y, loss_weight):
    """One micro-batch of a model that runs every layer: the loss of (x, y) under autocast, loss_weight times it
    backpropagated; returns the loss, detached. Each DP engine wraps it in its own way of holding the sync back."""
    with autocast:
        _, loss = forward(x, y)
    (loss * loss_weight).backward()
    return loss.detach()
