"""The process grid: torchrun's environment read in one place, and the ranks laid out as dp x pp x cp x tp. The same
code runs as a simulation on one CPU (gloo over loopback) and for real on GPUs (NCCL), started by torchrun."""

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from errors import UserError


@dataclass(frozen=True)
class Layout:
    """How the ranks share the model out: one value, its every field a flag (machinery/job/config.py), checked once by
    layout.check_layout and passed whole to the grid, the rank's model, the closed forms (closed_forms.py),
    the planner and the benchmarks. Frozen: a layout that passed its checks cannot change after them."""

    dp: int = 1  # data-parallel ranks: model copies, each reading its share of every batch
    tp: int = 1  # tensor-parallel ranks: one layer's matrices cut across them
    pp: int = 1  # pipeline stages: consecutive blocks on consecutive ranks
    sequence_parallel: bool = False  # with tp: the norm and dropout regions cut along the sequence, T/tp a rank
    cp: int = 1  # context-parallel ranks: each sequence cut across them, attention around a ring (context_parallel.py)
    # bucketed (async all-reduce overlapped with backward) | naive (one per parameter after it) |
    # ddp | fsdp (torch's own engines, machinery/job/torch_engines.py: pure data parallelism)
    dp_mode: str = "bucketed"
    bucket_mb: float = 25.0  # gradient bucket size for the bucketed mode
    zero: int = 0  # ZeRO stage (zero.py): 1 shards AdamW's moments over the dp ranks, 2 the gradients too; 0: none
    recompute: bool = False  # activation recomputation: each block's activations rebuilt in backward (model.py)
    dist_timeout: int = 300  # seconds a collective waits for a missing rank before the run stops with an error
    micro_batches: int = 1  # pipeline: each batch_size batch is cut into this many micro-batches
    schedule: str = "1f1b"  # pipeline schedule: gpipe (all forwards, then all backwards) | 1f1b
    virtual_stages: int = 1  # interleaved 1F1B: model chunks a pipeline rank holds (pipeline.py); 1: one stage

    @property
    def world_size(self):  # one process per rank of the grid
        return self.dp * self.tp * self.pp * self.cp

    @property
    def zero_stage(self):  # the training state shared out over dp: 0 none, 1 moments, 2 and gradients, 3 and weights
        return 3 if self.dp_mode == "fsdp" else self.zero

    @property
    def pipeline_micro_batches(self):  # the pieces a step's batch is cut into: a pipeline's m, else 1
        return self.micro_batches if self.pp > 1 else 1


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
    """Join the process group that torchrun set up (launch: launch_from_environment() if not given; MASTER_ADDR and
    MASTER_PORT name the meeting point); a plain `python train.py` joins none. nccl on CUDA, gloo on CPU, where each
    rank gets cores / local ranks threads: more threads than cores make the ranks fight."""
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


def check_grid(layout, world_size):
    """Every size at least 1, one process per rank of the grid: check_layout's last rule, and ProcessGrid's own."""
    dp, tp, pp, cp = layout.dp, layout.tp, layout.pp, layout.cp
    for name, size in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp)):
        if size < 1:
            raise UserError(f"--{name} {size} must be at least 1")
    if layout.world_size != world_size:
        sizes, product = (f"{dp}*{tp}*{pp}", "dp*tp*pp") if cp == 1 else (f"{dp}*{tp}*{pp}*{cp}", "dp*tp*pp*cp")
        raise UserError(
            f"{product} = {sizes} = {layout.world_size} but WORLD_SIZE = {world_size}: launch {layout.world_size} "
            f"processes (torchrun --nproc_per_node) or change --dp/--tp/--pp{'/--cp' if cp > 1 else ''}"
        )


class ProcessGrid:
    """World ranks laid out as a (dp, pp, cp, tp) grid, tp varying fastest:

        rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank

    so a TP group is tp consecutive ranks, which torchrun puts on one node: TP talks at every layer and needs the
    fast links inside a machine; CP next to it, at every attention; PP only between stages; DP once per step. Every
    rank creates every group (torch.distributed requires it) and keeps its own, each waiting at most --dist_timeout
    for a missing rank (a new group's own default is 30 minutes)."""

    def __init__(self, layout=Layout(), rank=0, world_size=1):
        check_grid(layout, world_size)
        self.timeout = timedelta(seconds=layout.dist_timeout)
        dp, tp, pp, cp = layout.dp, layout.tp, layout.pp, layout.cp
        self.dp, self.tp, self.pp, self.cp, self.rank, self.world_size = dp, tp, pp, cp, rank, world_size
        grid = torch.arange(world_size).view(dp, pp, cp, tp)  # the world rank at each (dp, pp, cp, tp) place
        self.dp_rank, self.pp_rank, self.cp_rank, self.tp_rank = (int(i) for i in (grid == rank).nonzero()[0])
        here = (self.dp_rank, self.pp_rank, self.cp_rank, self.tp_rank)

        def line(axis):  # the ranks that differ from this one in one dimension only, in order
            return grid[tuple(slice(None) if a == axis else i for a, i in enumerate(here))].tolist()

        def lines(axis):  # every such line of the grid: the groups of that dimension
            return grid.movedim(axis, -1).reshape(-1, grid.shape[axis])

        self.dp_ranks, self.pp_ranks, self.cp_ranks, self.tp_ranks = (line(axis) for axis in range(4))
        self.dp_group = self.tp_group = self.pp_group = self.cp_group = self.embedding_group = None
        self.pp_message_groups = {}
        if world_size > 1:
            self.dp_group = self._make_groups(lines(0))
            self.pp_group = self._make_groups(lines(1))
            self.tp_group = self._make_groups(lines(3))
        if cp > 1:
            self.cp_group = self._make_groups(lines(2))
        if pp > 1:  # the first and last stages share the tied embedding / output head
            self.embedding_group = self._make_groups(lines(1)[:, [0, -1]])
            # the stages' point-to-point messages, a group per kind ("F": activations, "B": their gradients): NCCL
            # matches two ranks' sends and receives in the order they are posted, whatever their tag, and an
            # interleaved pipeline on 2 stages receives both kinds from one neighbour, each kind in its own order
            self.pp_message_groups = {kind: self._make_groups(lines(1)) for kind in "FB"}

    def _make_groups(self, rank_lists):
        mine = None
        for ranks in rank_lists:
            group = dist.new_group(ranks.tolist(), timeout=self.timeout)
            if self.rank in ranks.tolist():
                mine = group
        return mine

    def on_rank0(self, fn):
        """fn() on rank 0 alone (a file written, data prepared), its result on every rank. What it raises stops every
        rank: a refusal (UserError) in its own words, a bug whole on rank 0 and named on the others."""
        result, problem, error = None, None, None
        if self.rank == 0:
            try:
                result = fn()
            except Exception as e:
                bug = f"rank 0 stopped on a bug ({type(e).__name__}: {e}); its traceback says where"
                error, problem = e, str(e) if isinstance(e, UserError) else bug
        if dist.is_initialized():
            box = [(result, problem)]
            dist.broadcast_object_list(box, src=0)
            result, problem = box[0]
        if problem is not None:
            raise error or UserError(problem)
        return result

    def __repr__(self):
        return (
            f"ProcessGrid(rank {self.rank}/{self.world_size}: dp {self.dp_rank}/{self.dp}, "
            f"pp {self.pp_rank}/{self.pp}, {f'cp {self.cp_rank}/{self.cp}, ' if self.cp > 1 else ''}"
            f"tp {self.tp_rank}/{self.tp})"
        )


def all_reduce_mean(value, group, size):
    """Mean of a tensor over a group (gloo has no AVG op: SUM, then divide)."""
    if size > 1:
        dist.all_reduce(value, group=group)
        value /= size
    return value
