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

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class ParallelConfig:
    dp: int = 1  # data-parallel ranks: model copies, each reading its share of every batch
    tp: int = 1  # tensor-parallel ranks: one layer's matrices cut across them
    pp: int = 1  # pipeline stages: consecutive blocks on consecutive ranks
    dp_mode: str = "bucketed"  # bucketed (async all-reduce overlapped with backward) | naive (one per parameter after it)
    bucket_mb: float = 25.0  # gradient bucket size for the bucketed mode
    dist_timeout: int = 300  # seconds a collective waits for a missing rank before the run stops with an error


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
        self.dp_group = self.tp_group = self.pp_group = None
        if world_size > 1:
            self.dp_group = self._make_groups([layout[:, p, t] for p in range(pp) for t in range(tp)])
            self.pp_group = self._make_groups([layout[d, :, t] for d in range(dp) for t in range(tp)])
            self.tp_group = self._make_groups([layout[d, p, :] for d in range(dp) for p in range(pp)])
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

    def __init__(self, model, group, size, mode="bucketed", bucket_mb=25.0):
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
        if mode == "bucketed":
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
