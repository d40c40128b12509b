"""Parallelism written by hand on torch.distributed: start-up, the process grid, data parallelism.

The same code runs as a simulation on one CPU (gloo over loopback) and for
real on GPUs (NCCL), started by torchrun:

    torchrun --standalone --nproc_per_node=2 train.py --dp 2          # 2 processes on this machine

Data parallelism (DP): every rank holds the whole model, reads its own share
of each batch, and before the shared update the group averages gradients
with all-reduce, so every rank takes the identical step. Tensor parallelism
(TP, tensor_parallel.py, after Megatron-LM) cuts each layer's matrices across
ranks; pipeline parallelism (PP, pipeline.py) gives each rank a stage of the
layers. The grid below places ranks for all three (3D parallelism).

The training loop reaches all of this through one small interface, the model
as a rank holds it (RankModel below): ShardedModel here, PipelineModel in
pipeline.py, torch's engines in torch_engines.py. Every all-reduce and send of a step's
gradients and activations is counted, per dimension (comm_count.py).
"""

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
import torch.nn as nn

from comm_count import counted
from tensor_parallel import tensor_parallel


@dataclass
class ParallelConfig:
    dp: int = 1  # data-parallel ranks: model copies, each reading its share of every batch
    tp: int = 1  # tensor-parallel ranks: one layer's matrices cut across them
    pp: int = 1  # pipeline stages: consecutive blocks on consecutive ranks
    # bucketed (async all-reduce overlapped with backward) | naive (one per parameter after it) |
    # ddp | fsdp (torch's own engines, torch_engines.py: pure data parallelism)
    dp_mode: str = "bucketed"
    bucket_mb: float = 25.0  # gradient bucket size for the bucketed mode
    zero: int = 0  # ZeRO stage (zero.py): 1 shards AdamW's moments over the dp ranks, 2 the gradients too; 0: none
    recompute: bool = False  # activation recomputation: each block's activations rebuilt in backward (model.py)
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
    local_world_size: int = 1
    device: str = "auto"  # cuda:LOCAL_RANK under torchrun on GPUs
    torchrun: bool = False  # started by torchrun (or local_ranks.py as torchrun would), else a plain `python train.py`


def launch_from_environment():
    """This process's place as torchrun set it up (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE); a plain
    `python train.py` has none of these and runs as rank 0 of 1."""
    if "WORLD_SIZE" not in os.environ:
        return Launch()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return Launch(
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        local_rank,
        int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu",
        torchrun=True,
    )


def init_distributed(timeout_seconds, launch=None):
    """Join the process group that torchrun set up (launch: launch_from_environment(), read if not given;
    MASTER_ADDR and MASTER_PORT name the meeting point); a plain `python train.py` joins none.

    Backend nccl on CUDA, gloo on CPU. On CPU each rank gets cores / local ranks
    threads: more threads than cores make the ranks fight over them.
    """
    launch = launch or launch_from_environment()
    if not launch.torchrun:
        return launch
    if torch.cuda.is_available():
        torch.cuda.set_device(launch.local_rank)
        backend = "nccl"
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // launch.local_world_size))
        backend = "gloo"
    if launch.world_size > 1:
        dist.init_process_group(
            backend, rank=launch.rank, world_size=launch.world_size, timeout=timedelta(seconds=timeout_seconds)
        )
    return launch


def destroy_distributed():
    if dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------
# The process grid


def check_grid(dp, tp, pp, world_size):
    """Every size at least 1, and one process per rank of the grid: layout.check_layout's last rule, and
    ProcessGrid's own check."""
    for name, size in (("dp", dp), ("tp", tp), ("pp", pp)):
        if size < 1:
            raise ValueError(f"--{name} {size} must be at least 1")
    if dp * tp * pp != world_size:
        raise ValueError(
            f"dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} but WORLD_SIZE = {world_size}: "
            f"launch {dp * tp * pp} processes (torchrun --nproc_per_node) or change --dp/--tp/--pp"
        )


class ProcessGrid:
    """World ranks laid out as a (dp, pp, tp) grid, tp varying fastest:

        rank = (dp_rank * pp + pp_rank) * tp + tp_rank

    so a TP group is tp consecutive ranks, which torchrun puts on one node: TP
    talks at every layer and needs the fast links inside a machine; PP talks
    only between stages; DP once per step. Each rank belongs to one group per
    dimension; every rank creates every group (torch.distributed requires it)
    and keeps its own. Each group's collectives wait at most timeout_seconds for a
    missing rank (--dist_timeout), as the world's do: a new group's own default is 30 minutes.
    """

    def __init__(self, dp, tp, pp, rank=0, world_size=1, timeout_seconds=None):
        check_grid(dp, tp, pp, world_size)
        self.timeout = None if timeout_seconds is None else timedelta(seconds=timeout_seconds)
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
            group = dist.new_group(ranks.tolist(), timeout=self.timeout)
            if self.rank in ranks.tolist():
                mine = group
        return mine

    def __repr__(self):
        return (
            f"ProcessGrid(rank {self.rank}/{self.world_size}: dp {self.dp_rank}/{self.dp}, "
            f"pp {self.pp_rank}/{self.pp}, tp {self.tp_rank}/{self.tp})"
        )


def all_reduce_mean(value, group, size):
    """Mean of a tensor over a group (gloo has no AVG op: SUM, then divide)."""
    if size > 1:
        dist.all_reduce(value, group=group)
        value /= size
    return value


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

    At start, every rank takes DP rank 0's parameters (a broadcast), so all copies begin
    identical; with identical averaged gradients they stay so. Under gradient accumulation only
    the last micro-batch syncs (`sync = False` before the others): the sum of local gradients is
    averaged once, which equals averaging each micro-batch.
    """

    zero_stage = 0  # how much of the training state is shared out over the replicas (zero.py: 1 or 2)
    shards_gradients = False  # every rank holds every averaged gradient (under ZeRO, a shard of them)
    reduces_every_micro_batch = False  # under accumulation, only the last micro-batch (ZeRO-2 reduces each)

    def __init__(self, module, grid):
        self.group, self.size = grid.dp_group, grid.dp
        self.params = [p for p in module.parameters() if p.requires_grad]  # a tied matrix appears once
        source = dist.get_global_rank(self.group, 0)
        for p in self.params:
            dist.broadcast(p.data, src=source, group=self.group)
        self.sync = True

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

    def __init__(self, module, grid, overlap=True):
        super().__init__(module, grid)  # overlap: nothing to overlap, every all-reduce waits for backward

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
        if not (self.sync or self.reduces_every_micro_batch):
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


def data_parallel(engine, **options):
    """How ShardedModel and PipelineModel build their DP engine: make(module, grid, overlap) gives
    `engine` (NaiveDataParallel, BucketedDataParallel, or ZeRO's) over the grid's dp group, or None when dp is 1."""

    def make(module, grid, overlap=True):
        return engine(module, grid, overlap=overlap, **options) if grid.dp > 1 else None

    return make


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


# ----------------------------------------------------------------------------
# The model as a rank holds it: what the training loop needs from a layout


@runtime_checkable
class RankModel(Protocol):
    """The model as a rank holds it: everything the loop, evaluation and checkpoints ask of a layout.

    The loop never asks which layout it runs on. A rank that runs every layer is a ShardedModel
    (below: the whole GPT, or its tensor-parallel slices), a rank that runs one stage of the layers a
    PipelineModel (pipeline.py), and torch's own data parallelism a DDPModel or FSDPModel
    (torch_engines.py). layout.model_for_rank builds the one this rank needs; tests/test_layout.py
    checks that each of the four has every member below.
    """

    module: nn.Module  # the parameters this rank holds and updates (its stage, its slices, its shards)
    device: torch.device  # where they live
    autocast: contextlib.AbstractContextManager  # the compute dtype its forwards run under (nullcontext: fp32)
    grid: ProcessGrid  # this rank's place among the others
    dp: "DataParallel | None"  # the hand-written DP engine (its optimizer() updates what this rank holds); else None
    micro_batches: int  # the pieces forward_backward cuts a batch into: a pipeline's m, else 1
    in_flight: int  # micro-batches whose activations a rank keeps at once: 1F1B's peak, else 1
    zero_stage: int  # the training state shared out over dp: 0 none, 1 moments, 2 and gradients, 3 and weights

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, loss_weight: float, sync: bool = True):
        """One micro-batch: its loss times loss_weight backpropagated; sync: the last before the update. -> loss"""

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward only, for evaluation: the mean loss of (x, y), on every rank."""

    def reduce_gradients(self) -> None:
        """After the last micro-batch: the DP average (and a pipeline's tied copies summed)."""

    def clear_gradients(self) -> None:
        """After the update: the gradients cleared for the next step."""

    def grad_norm(self) -> torch.Tensor:
        """The global L2 norm of the gradient, over every rank's share, the same on every rank."""

    def local_parameters(self) -> list:
        """[(single-device name, parameter, its Cut or None)], each parameter once: how it was cut."""

    def report(self, out_dir: str, say, is_rank0: bool) -> None:
        """The layout's own account at the end of the run (a pipeline's bubble and Gantt chart)."""


def forward_and_backward(forward, autocast, x, y, loss_weight):
    """One micro-batch of a model that runs every layer: the loss of (x, y) under autocast, loss_weight times it
    backpropagated; returns the loss, detached. Each DP engine wraps it in its own way of holding the sync back."""
    with autocast:
        _, loss = forward(x, y)
    (loss * loss_weight).backward()
    return loss.detach()


class ShardedModel:
    """A rank that runs every layer of the GPT: all of each matrix (tp = 1), or its
    tensor-parallel slices (tp > 1); gradients averaged over the dp replicas by the engine
    make_dp builds (data_parallel: NaiveDataParallel, BucketedDataParallel, or ZeRO's)."""

    def __init__(
        self,
        model,
        grid,
        autocast=contextlib.nullcontext(),
        compile=False,
        make_dp=data_parallel(BucketedDataParallel),
    ):
        self.cuts = tensor_parallel(model, grid)  # each rank keeps its slices; {} when tp = 1
        self.module, self.grid, self.autocast = model, grid, autocast
        self.micro_batches = self.in_flight = 1  # one forward per micro-step (a pipeline cuts it into more)
        self.device = next(model.parameters()).device
        self.forward = torch.compile(model) if compile else model
        self.dp = make_dp(model, grid)
        self.zero_stage = zero_stage_of(self.dp)

    def forward_backward(self, x, y, loss_weight, sync=True):
        if self.dp is not None:
            self.dp.sync = sync  # under accumulation only the last micro-batch starts the all-reduces
        return forward_and_backward(self.forward, self.autocast, x, y, loss_weight)

    def loss(self, x, y):
        with self.autocast:
            return self.forward(x, y)[1]

    def reduce_gradients(self):
        if self.dp is not None:
            self.dp.finish()

    def clear_gradients(self):
        clear_gradients(self.module, self.dp)

    def grad_norm(self):
        return sharded_grad_norm(self.local_parameters(), self.grid, self.dp)

    def local_parameters(self):
        return [(name, p, self.cuts.get(name)) for name, p in self.module.named_parameters()]

    def report(self, out_dir, say, is_rank0):
        pass  # every rank ran every layer: nothing beyond the run's own account


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


def raise_on_every_rank(problem):
    """Gather every rank's problem (a message, or None); if any rank has one, every rank raises
    it as a ValueError, so no rank waits in a collective for one that gave up. A barrier too."""
    problems = [problem]
    if dist.is_initialized():
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    failed = [p for p in problems if p]
    if failed:
        raise ValueError(failed[0] + (f" (and {len(failed) - 1} more rank(s) alike)" if len(failed) > 1 else ""))


def check_visible_everywhere(paths):
    """Stop every rank if some rank cannot see a file that rank 0 just wrote.

    Rank 0 alone prepares the data and writes run.json and the checkpoints; every rank
    reads them. On several machines that works only if the folders are on a file
    system that every machine mounts: a rank that saw no checkpoint would silently
    start from step 0 while the others resume."""
    missing = [path for path in paths if not os.path.exists(path)]
    rank = dist.get_rank() if dist.is_initialized() else 0
    raise_on_every_rank(
        None
        if not missing
        else (
            f"rank {rank} cannot see {missing[0]}, which rank 0 wrote. Every rank reads the data and the "
            "checkpoints that rank 0 writes: on several machines put --data_dir and --out_dir on a file system "
            "that every machine mounts (NFS, Lustre, ...)."
        )
    )
