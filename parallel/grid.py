"""The process grid: torchrun's environment read in one place, the ranks laid out as dp x pp x tp, and the
coordination the loop needs so that no rank waits forever for one that gave up.

The same code runs as a simulation on one CPU (gloo over loopback) and for real on GPUs (NCCL), started by torchrun:

    torchrun --standalone --nproc_per_node=2 train.py --dp 2          # 2 processes on this machine
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
    sequence_parallel: bool = False  # with tp: the norm and dropout regions cut along the sequence, T/tp a rank
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
