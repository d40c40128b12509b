"""Data parallelism by torch's own engines: DistributedDataParallel (DDP) and FSDP2 (`fully_shard`).

    torchrun --standalone --nproc_per_node=2 train.py --dp 2 --dp_mode ddp    # torch's DDP
    torchrun --standalone --nproc_per_node=2 train.py --dp 2 --dp_mode fsdp   # FSDP2: ZeRO-3, by torch

The road past the course. data_parallel.BucketedDataParallel is written to be read:
every line of the gradient average is on the page, and it composes with our
tensor and pipeline parallelism into the 3D layouts. The two engines here do the
same job the way production runs do it, behind the same interface (layout.RankModel,
the model as a rank holds it), so the same loop trains with them and takes the
same steps (tests/test_torch_engines.py).

DDP: every rank holds the whole model, as ours does; its C++ reducer all-reduces
gradients in buckets while backward runs, tuned over years of production use.
FSDP2 (ZeRO stage 3, arXiv:1910.02054): every parameter, its gradient and its
AdamW moments are DTensors cut into dp shards along dim 0, one per rank. Before a
block runs, its parameters are all-gathered; after its backward, the gradients
are reduce-scattered, each rank receiving the average of its own shard. A rank
then keeps about 1/dp of the 16 bytes per parameter of fp32 weights, gradients
and moments, at about 1.5x DDP's traffic (the all-gathers again in backward).

Which to use: ours to learn from, and to combine with --tp and --pp; DDP to
train a model that fits on one device, fast; FSDP when it does not fit. Both
here are pure data parallelism: --tp 1 --pp 1 (torchtitan composes FSDP2 with
torch's own TP and PP over a DeviceMesh; that is the next road).
"""

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parallel.comm_count import counted
from parallel.layout import TORCH_ENGINES, check_layout, forward_and_backward, model_for_rank
from parallel.optimizer import sharded_grad_norm

# torch's engines are imported where they are used: torch.distributed.tensor, on which FSDP2 and DDP's hooks
# build, takes ~0.7 s to import, which every run of train.py (every rank) would pay for an engine it does not use.
# Both are pure data parallelism: layout.check_layout refuses them with --tp or --pp.


# ----------------------------------------------------------------------------
# The model as this rank holds it: torch's engine, or ours


def rank_model(whole, grid, layout, batch_size, dtype=torch.float32, autocast=contextlib.nullcontext(), compile=False):
    """The model as this rank holds it (a layout.RankModel): under --dp_mode ddp or fsdp torch's own engine over the
    whole GPT, else our hand-written layout's (parallel.layout.model_for_rank). The layout is checked first."""
    if layout.dp_mode not in TORCH_ENGINES:
        return model_for_rank(whole, grid, layout, batch_size, dtype, autocast, compile)
    check_layout(layout, whole.config, batch_size, grid.world_size, dtype)
    whole.recompute = layout.recompute
    if layout.dp_mode == "ddp":
        return DDPModel(whole, grid, autocast, compile, layout.bucket_mb)
    return FSDPModel(whole, grid, autocast, compile)


# ----------------------------------------------------------------------------
# DDP


def counted_allreduce(group, bucket):
    """DDP's comm hook: its default all-reduce (divide by the group's size, then sum), each bucket counted
    (comm_count.py) as our BucketedDataParallel counts its own."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    counted("dp", bucket.buffer())
    return allreduce_hook(group, bucket)


class DDPModel:
    """The model as a rank holds it under torch's DistributedDataParallel: the whole GPT on every rank, its
    gradients averaged in buckets of bucket_mb during backward. At construction DDP broadcasts DP rank 0's
    parameters, so every replica starts identical. A group of one needs no DDP: the GPT trains as it is."""

    def __init__(self, model, grid, autocast=contextlib.nullcontext(), compile=False, bucket_mb=25.0):
        self.module, self.grid, self.autocast = model, grid, autocast  # module: the GPT, single-device names
        self.micro_batches = self.in_flight = 1
        self.dp, self.zero_stage = None, 0  # DDP averages the gradients; every rank holds the whole state
        self.device = next(model.parameters()).device
        self.ddp = None
        if grid.dp > 1:
            from torch.nn.parallel import DistributedDataParallel

            # gradient_as_bucket_view: the gradients are views into DDP's buckets, as in our bucketed DP
            self.ddp = DistributedDataParallel(
                model, process_group=grid.dp_group, bucket_cap_mb=bucket_mb, gradient_as_bucket_view=True
            )
            self.ddp.register_comm_hook(grid.dp_group, counted_allreduce)
        wrapped = self.ddp or model
        self.forward = torch.compile(wrapped) if compile else wrapped

    def forward_backward(self, x, y, loss_weight, sync=True):
        # under accumulation only the last micro-batch all-reduces: no_sync() around the others' forward and backward
        skip_sync = self.ddp.no_sync() if self.ddp is not None and not sync else contextlib.nullcontext()
        with skip_sync:
            return forward_and_backward(self.forward, self.autocast, x, y, loss_weight)

    def loss(self, x, y):
        with self.autocast:
            return self.module(x, y)[1]  # forward only: nothing for DDP to average, so the GPT itself

    def reduce_gradients(self):
        pass  # DDP waited for its all-reduces at the end of the last backward

    def clear_gradients(self):
        self.module.zero_grad(set_to_none=True)

    def grad_norm(self):
        return sharded_grad_norm(self.local_parameters(), self.grid)  # every rank holds every averaged gradient

    def local_parameters(self):
        return [(name, p, None) for name, p in self.module.named_parameters()]

    def timeline(self):
        return None  # pure data parallelism: no stages to draw


# ----------------------------------------------------------------------------
# FSDP2


@dataclass(frozen=True)
class DTensorCut:
    """How FSDP2 holds a parameter, its gradient and its AdamW moments: a DTensor, its rows cut into dp shards
    (torch.chunk's split). checkpoint.py gathers and cuts through it, as through a tensor-parallel Cut."""

    mesh: object  # the DP group's DeviceMesh
    placements: tuple

    def shard(self, full, grid):
        """This rank's shard of a single-device tensor every rank holds, as a DTensor (no communication)."""
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, self.mesh, self.placements, src_data_rank=None)

    def unshard(self, local, grid):
        """The single-device tensor, all-gathered from every rank's shard (over the mesh: grid is for the interface)."""
        return local.full_tensor()


class CountedReduceScatter:
    """FSDP2's reduce-scatter of the gradients, as torch's default does it, its input counted (comm_count.py)
    like DP's all-reduce: both hand over the gradient of every parameter once per step. FSDP2 also all-gathers
    the parameters (P/dp bytes in, forward and again in backward): parameters, not gradients or activations,
    so not counted. FSDPModule.set_custom_reduce_scatter takes any object with these two methods."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return dist.reduce_scatter_single(output_tensor, counted("dp", input_tensor), op, group, async_op)


class FSDPModel:
    """The model as a rank holds it under FSDP2: each block is one FSDP unit (all-gathered just before it runs,
    freed after), the root holds the rest (the embeddings with the tied head, the final norm). Parameters keep
    their single-device names. Ranks first take DP rank 0's weights (a broadcast; fully_shard keeps each rank's
    own rows). A group of one shards nothing: the GPT trains as it is."""

    def __init__(self, model, grid, autocast=contextlib.nullcontext(), compile=False):
        self.module, self.grid, self.autocast = model, grid, autocast
        self.micro_batches = self.in_flight = 1
        self.dp, self.zero_stage = None, 3  # FSDP2 reduce-scatters; weights, gradients and moments are sharded
        self.device = next(model.parameters()).device
        self.cut, self.units = None, []
        if grid.dp > 1:
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import FSDPModule, fully_shard

            source = dist.get_global_rank(grid.dp_group, 0)
            for p in model.parameters():
                dist.broadcast(p.data, src=source, group=grid.dp_group)
            mesh = DeviceMesh.from_group(grid.dp_group, self.device.type)
            # No MixedPrecisionPolicy: the all-gathers carry fp32 weights, which the run's autocast casts as it
            # does on one process. param_dtype=torch.bfloat16 would halve those bytes but round the norms' and
            # embeddings' weights too, which one process keeps in fp32.
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            self.units = [m for m in model.modules() if isinstance(m, FSDPModule)]
            for unit in self.units:
                unit.set_custom_reduce_scatter(CountedReduceScatter())
            p = next(model.parameters())
            self.cut = DTensorCut(p.device_mesh, p.placements)  # every parameter alike: Shard(0) over the DP group
        self.forward = torch.compile(model) if compile else model

    def forward_backward(self, x, y, loss_weight, sync=True):
        if self.units:
            # Under accumulation only the last micro-batch reduce-scatters; the others add up whole gradients,
            # on the whole parameters they keep (not resharded after backward) until clear_gradients() frees them.
            self.module.set_requires_gradient_sync(sync)
            self.module.set_reshard_after_backward(sync)
        return forward_and_backward(self.forward, self.autocast, x, y, loss_weight)

    def loss(self, x, y):
        with self.autocast:
            loss = self.forward(x, y)[1]
        self._reshard()  # the root keeps its whole parameters after forward, for a backward that does not come
        return loss

    def reduce_gradients(self):
        pass  # FSDP2 waited for its reduce-scatters at the end of the last backward

    def clear_gradients(self):
        # zero_grad reaches the gradients of the parameters registered now: the shards after a synced backward;
        # after an unsynced one (reporting.timed_step_seconds), the whole parameters, which reshard() then frees
        self.module.zero_grad(set_to_none=True)
        self._reshard()

    def _reshard(self):
        """Every unit back to its shards: between steps the optimizer, the clip and the checkpoint see DTensors."""
        for unit in self.units:
            unit.reshard()

    def grad_norm(self):
        """The L2 norm of the averaged gradient: each rank squares its shards, the DP group sums the squares
        (every element lives on exactly one rank, the tied matrix once)."""
        if not self.units:
            return sharded_grad_norm(self.local_parameters(), self.grid)
        shards = [p.grad.to_local().float() for p in self.module.parameters() if p.grad is not None]
        squares = torch.nn.utils.get_total_norm(shards, foreach=True).pow(2)
        dist.all_reduce(squares, group=self.grid.dp_group)
        return squares.sqrt()

    def local_parameters(self):
        return [(name, p, self.cut) for name, p in self.module.named_parameters()]

    def timeline(self):
        return None  # pure data parallelism: no stages to draw
