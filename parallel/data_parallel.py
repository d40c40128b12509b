"""Data parallelism by hand: every rank holds the whole model (or its TP slices, or its pipeline stage), reads its own
share of each batch, and the group averages gradients with all-reduce (one per parameter, or buckets overlapped with
backward), so every rank takes the identical step. ZeRO's engines (zero.py) share the training state out instead.

    torchrun --standalone --nproc_per_node=2 train.py --dp 2          # 2 replicas, each half of every batch
"""

import contextlib

import torch
import torch.distributed as dist

from parallel.comm_count import counted


class DataParallel:
    """What every hand-written data-parallel engine shares. At start every rank takes DP rank 0's whole module state
    (every parameter, trainable or frozen, and every buffer), so all copies begin identical, as torch's DDP makes
    them, and identical averaged gradients keep them so (DDP broadcasts buffers again before each forward, these
    engines only at the start). Under gradient accumulation only the last micro-batch syncs (`with dp.no_sync():`
    around the others, as with DDP): the sum of local gradients is averaged once, as averaging each would."""

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


class Buckets:
    """Parameters grouped, in roughly the order backward produces their gradients (last layers first), into buckets
    of about bucket_mb, each bucket laid out as one flat buffer, its parameters one after another: what
    BucketedDataParallel sends as one message, and what ZeRO's stages (zero.py) cut into `shards` equal shards
    (each flat buffer then padded to a multiple of shards)."""

    def __init__(self, params, bucket_mb=25.0, shards=1):
        self.params, bucket, bucket_bytes = [], [], 0  # [bucket: [parameter]]
        for p in reversed(params):  # backward meets the last layers first
            bucket.append(p)
            bucket_bytes += p.numel() * p.element_size()
            if bucket_bytes >= bucket_mb * 2**20:
                self.params.append(bucket)
                bucket, bucket_bytes = [], 0
        if bucket:
            self.params.append(bucket)
        self.index = {p: i for i, b in enumerate(self.params) for p in b}  # parameter -> its bucket
        self.sizes = [sum(p.numel() for p in b) for b in self.params]  # elements of each bucket's parameters
        self.shards = shards
        self.shard_numel = [-(-size // shards) for size in self.sizes]  # over `shards`, rounded up: the padding

    def __len__(self):
        return len(self.params)

    def new_flat(self, i):
        """A zeroed flat buffer for bucket i: (shards * shard numel,)."""
        p = self.params[i][0]
        return torch.zeros(self.shard_numel[i] * self.shards, dtype=p.dtype, device=p.device)

    def shard(self, flat, i, rank):
        """Shard `rank` of bucket i's flat buffer: a view, (shard numel,)."""
        return flat[rank * self.shard_numel[i] : (rank + 1) * self.shard_numel[i]]

    def views(self, flat, i):
        """Each of bucket i's parameters' shapes as a view into the flat buffer, in order (the padding left out)."""
        views, offset = [], 0
        for p in self.params[i]:
            views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        return views


class BucketedDataParallel(DataParallel):
    """The gradients averaged in buckets (Buckets), each sent while backward still runs. Each bucket's gradients
    are views into its flat buffer, so backward accumulates straight into the buffer that is sent: no copy in, no
    copy out. A post-accumulate-grad hook counts the gradients that are ready; when a bucket is complete its
    all-reduce is launched asynchronously, so communication overlaps the rest of backward:

        backward:  [blocks L..k grads] [blocks k..1 grads] [embeddings]
        network:              [all-reduce bucket 0] [bucket 1]   [bucket 2]

    finish() waits for them and divides by the group size: the gradients, views, are then the average.
    clear_gradients() zeroes the buffers in place. shards: ZeRO-1's (zero.py), which reduce-scatters them."""

    def __init__(self, module, grid, overlap=True, bucket_mb=25.0, shards=1):
        super().__init__(module, grid)
        self.buckets = Buckets(self.params, bucket_mb, shards)
        self.flats = [self.buckets.new_flat(i) for i in range(len(self.buckets))]
        self.views = [self.buckets.views(flat, i) for i, flat in enumerate(self.flats)]  # each parameter's gradient
        self.clear_gradients()
        self.ready = [0] * len(self.buckets)
        self.launched = {}  # bucket index -> (flat gradient, handle of its asynchronous all-reduce)
        # A pipeline stage runs backward once per micro-batch, so gradients are complete only at the end of the
        # schedule: there (overlap=False) every bucket is launched in finish().
        if overlap:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, param):
        if not self._sync:
            return
        i = self.buckets.index[param]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets.params[i]):
            self._launch(i)

    def _launch(self, i):
        flat = self.fill_bucket(i)
        self.launched[i] = (flat, dist.all_reduce(counted("dp", flat), group=self.group, async_op=True))

    def fill_bucket(self, i):
        """Bucket i's flat buffer, every gradient of the bucket in it (they are views into it from here on)."""
        for p, view in zip(self.buckets.params[i], self.views[i]):
            if p.grad is None:  # an unused parameter, or a gradient someone set to None: a zero gradient
                view.zero_()
            elif p.grad is not view:  # replaced by a new tensor: back into the bucket
                view.copy_(p.grad)
            p.grad = view
        return self.flats[i]

    def clear_gradients(self):
        """Zero every gradient for the next step, in place: they stay views into the buckets."""
        for flat, bucket, views in zip(self.flats, self.buckets.params, self.views):
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


def clear_gradients(module, dp):
    """After the update: every gradient cleared for the next step by the DP engine, or freed when there is none."""
    if dp is not None:
        dp.clear_gradients()
    else:
        module.zero_grad(set_to_none=True)
