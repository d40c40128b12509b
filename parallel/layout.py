"""The layout: how the ranks share the model out, checked in one place, and the model as this rank holds it.

A layout is one frozen value, parallel.grid.Layout, whose fields are the flags --dp, --tp, --pp, --cp,
--sequence_parallel, --dp_mode, --bucket_mb, --zero, --micro_batches, --schedule, --virtual_stages, --recompute
(and --dist_timeout). Two functions hold all of it:

    check_layout(layout, gpt_config, batch_size, world_size, dtype)   every rule, in one order, naming the flag
    model_for_rank(whole, grid, layout, batch_size, dtype)            the model as this rank holds it (RankModel)

train.py never asks which layout it runs on: run_setup.py checks the layout before any process group exists
(a collective would wait forever for a peer that refused) and builds the rank's model here, and everything
after talks to the RankModel interface.
"""

import contextlib
from typing import Protocol, runtime_checkable

import torch
import torch.nn as nn

from errors import UserError
from parallel.context_parallel import average_over_cp, context_parallel, cut_sequences, mean_over_cp
from parallel.data_parallel import BucketedDataParallel, DataParallel, NaiveDataParallel, clear_gradients
from parallel.grid import ProcessGrid, check_grid
from parallel.optimizer import sharded_grad_norm
from parallel.pipeline import SCHEDULES, PipelineModel, PipelineRank
from parallel.tensor_parallel import tensor_parallel
from parallel.zero import Zero1DataParallel, Zero2DataParallel

HAND_WRITTEN = ("bucketed", "naive")  # --dp_mode: data_parallel.py's engines
TORCH_ENGINES = ("ddp", "fsdp")  # --dp_mode: torch's own (machinery/job/torch_engines.py), pure data parallelism
ZERO_STAGES = {1: Zero1DataParallel, 2: Zero2DataParallel}  # --zero: zero.py (stage 3 is --dp_mode fsdp)


# ----------------------------------------------------------------------------
# The model as a rank holds it: what the training loop needs from a layout


@runtime_checkable
class RankModel(Protocol):
    """The model as a rank holds it: everything the loop, evaluation and checkpoints ask of a layout.

    The loop never asks which layout it runs on. A rank that runs every layer is a ShardedModel
    (below: the whole GPT, or its tensor-parallel slices), a rank that runs one stage of the layers a
    PipelineModel (pipeline.py), and torch's own data parallelism a DDPModel or FSDPModel
    (torch_engines.py). model_for_rank builds ours (torch_engines.rank_model torch's); tests/test_layout.py
    checks that each of the four has every member below.
    """

    module: nn.Module  # the parameters this rank holds and updates (its stage, its slices, its shards)
    device: torch.device  # where they live
    autocast: contextlib.AbstractContextManager  # the compute dtype its forwards run under (nullcontext: fp32)
    grid: ProcessGrid  # this rank's place among the others
    dp: "DataParallel | None"  # the hand-written DP engine (its optimizer() updates what this rank holds); else None
    micro_batches: int  # the pieces forward_backward cuts a batch into: a pipeline's m, else 1
    in_flight: float  # stages' worth of micro-batch activations a rank keeps at once: a schedule's peak, else 1
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

    def timeline(self) -> list | None:
        """A pipeline's last step as every stage ran it ([stage: [Slot]], gathered: every rank calls it); else None."""


class ShardedModel:
    """A rank that runs every layer of the GPT: all of each matrix (tp = 1), or its tensor-parallel slices
    (cuts), at every position or at its share of each sequence (positions, under cp); gradients averaged
    over the dp replicas by its DP engine (dp: NaiveDataParallel, BucketedDataParallel, ZeRO's of stage
    zero_stage, or None). model_for_rank builds it, each parallelism applied in plain view."""

    def __init__(
        self, model, grid, cuts, positions, dp, zero_stage=0, autocast=contextlib.nullcontext(), compile=False
    ):
        self.module, self.grid, self.cuts, self.positions, self.dp = model, grid, cuts, positions, dp
        self.autocast, self.forward = autocast, torch.compile(model) if compile else model
        self.micro_batches = self.in_flight = 1  # one forward per micro-step (a pipeline cuts it into more)
        self.device, self.zero_stage = next(model.parameters()).device, zero_stage

    def forward_backward(self, x, y, loss_weight, sync=True):
        # under accumulation only the last micro-batch starts the all-reduces: no_sync() around the others
        hold = self.dp.no_sync() if self.dp is not None and not sync else contextlib.nullcontext()
        x, y = cut_sequences(x, y, self.positions)
        with hold:
            return mean_over_cp(forward_and_backward(self.forward, self.autocast, x, y, loss_weight), self.grid)

    def loss(self, x, y):
        x, y = cut_sequences(x, y, self.positions)
        with self.autocast:
            return mean_over_cp(self.forward(x, y)[1], self.grid)

    def reduce_gradients(self):
        if self.dp is not None:
            self.dp.finish()

    def clear_gradients(self):
        clear_gradients(self.module, self.dp)

    def grad_norm(self):
        return sharded_grad_norm(self.local_parameters(), self.grid, self.dp, self.zero_stage)

    def local_parameters(self):
        return [(name, p, self.cuts.get(name)) for name, p in self.module.named_parameters()]

    def timeline(self):
        return None  # every rank ran every layer: no stages to draw


def forward_and_backward(forward, autocast, x, y, loss_weight):
    """One micro-batch of a model that runs every layer: the loss of (x, y) under autocast, loss_weight times it
    backpropagated; returns the loss, detached. Each rank model wraps it in its own way of holding the sync back
    (ShardedModel, and torch's engines in machinery/job/torch_engines.py)."""
    with autocast:
        _, loss = forward(x, y)
    (loss * loss_weight).backward()
    return loss.detach()


def check_layout(layout, gpt_config, batch_size, world_size, dtype):
    """Name a layout (a Layout) that cannot work for this model (a GPTConfig), batch_size rows per
    micro-step, world_size processes and the compute dtype, before any process group exists. The engine
    first (it decides which other flags may combine), then the cuts, then the processes to launch."""
    dp, tp, pp, cp = layout.dp, layout.tp, layout.pp, layout.cp
    # data parallelism: ours, or torch's engines, which are pure data parallelism
    if layout.dp_mode not in (*HAND_WRITTEN, *TORCH_ENGINES):
        choices = f"{', '.join(HAND_WRITTEN)}, {' or '.join(TORCH_ENGINES)}"
        raise UserError(f"--dp_mode {layout.dp_mode!r}: choose {choices}")
    if layout.dp_mode in TORCH_ENGINES and (tp > 1 or pp > 1 or cp > 1):
        raise UserError(
            f"--dp_mode {layout.dp_mode} is torch's pure data parallelism and needs --tp 1 --pp 1 --cp 1, got "
            f"--tp {tp} --pp {pp} --cp {cp}: pass --dp_mode bucketed (or naive) to combine data parallelism with them"
        )
    # ZeRO: the state shared out over the dp ranks, built on the bucketed gradients
    if layout.zero not in (0, *ZERO_STAGES):
        raise UserError(
            f"--zero {layout.zero}: choose 1 (AdamW's moments sharded over the dp ranks), 2 (the gradients too) or 0; "
            "stage 3, the weights sharded too, is torch's FSDP2: --dp_mode fsdp"
        )
    if layout.zero and dp == 1:
        raise UserError(
            f"--zero {layout.zero} shares the training state out over the data-parallel ranks, and --dp is 1: "
            "pass --dp 2 or more, or leave out --zero"
        )
    if layout.zero == 2 and pp > 1:
        raise UserError(
            "--zero 2 keeps only a shard of each gradient, reduced as backward completes it; a pipeline stage runs "
            "backward once per micro-batch, so its whole gradient piles up until the schedule ends anyway: pass "
            "--zero 1 with --pp"
        )
    if layout.zero and layout.dp_mode != "bucketed":
        raise UserError(
            f"--zero {layout.zero} is built on the bucketed gradients: leave out --dp_mode {layout.dp_mode}"
        )
    # tensor parallelism: heads are the unit of the cut (n_embd = n_head x head size, so n_embd follows);
    # the vocabulary never blocks it, as it is padded to a multiple of tp (tp < 1: check_grid names it below)
    if tp >= 1 and gpt_config.n_head % tp:
        raise UserError(
            f"n_head {gpt_config.n_head} is not divisible by tp {tp}: choose --tp among the divisors "
            f"of n_head, or --n_head a multiple of {tp} (with --n_embd a multiple of it)"
        )
    if tp >= 1 and gpt_config.kv_heads % tp:  # GQA: each rank keeps the key/value heads its query heads read
        raise UserError(
            f"n_kv_head {gpt_config.kv_heads} is not divisible by tp {tp}: each rank holds n_kv_head / tp key/value "
            f"heads; choose --tp among the divisors of n_kv_head, or --n_kv_head a multiple of {tp}"
        )
    if tp >= 1 and gpt_config.hidden % tp:
        raise UserError(f"the MLP's hidden width {gpt_config.hidden} is not divisible by tp {tp}: set --mlp_hidden")
    if layout.sequence_parallel and tp < 2:
        raise UserError(
            f"--sequence_parallel cuts along the sequence what tensor parallelism leaves whole, and --tp is {tp}: "
            "pass --tp 2 or more, or leave out --sequence_parallel"
        )
    if layout.sequence_parallel and gpt_config.block_size % tp:
        raise UserError(
            f"--sequence_parallel gives each of the {tp} TP ranks block_size / tp positions, and block_size "
            f"{gpt_config.block_size} is not divisible by {tp}: choose --block_size a multiple of {tp}"
        )
    # context parallelism: 2 cp equal chunks of the sequence, an early and a late one a rank; attention without dropout
    if cp > 1 and gpt_config.block_size % (2 * cp):
        raise UserError(
            f"--cp {cp} cuts each sequence into 2 x {cp} equal chunks, two a rank, and block_size "
            f"{gpt_config.block_size} is not divisible by {2 * cp}: choose --block_size a multiple of {2 * cp}"
        )
    if cp > 1 and layout.sequence_parallel and gpt_config.block_size % (cp * tp):
        raise UserError(
            f"--sequence_parallel cuts each rank's block_size / cp = {gpt_config.block_size // cp} positions over "
            f"tp {tp}: choose --block_size a multiple of cp x tp = {cp * tp}"
        )
    if cp > 1 and gpt_config.dropout > 0:
        raise UserError(
            f"--cp {cp}: ring attention has no attention dropout, and --dropout is {gpt_config.dropout}: pass "
            "--dropout 0 (pretraining's usual setting)"
        )
    # pipeline parallelism: every stage at least one block, every micro-batch the same size
    if gpt_config.n_layer < pp:
        raise UserError(
            f"n_layer {gpt_config.n_layer} < pp {pp}: every pipeline stage needs at least one block; "
            "lower --pp or raise --n_layer"
        )
    if pp > 1:
        if layout.micro_batches < 1:
            raise UserError(f"--micro_batches {layout.micro_batches} must be at least 1")
        if batch_size % layout.micro_batches:
            raise UserError(f"batch_size {batch_size} is not divisible by micro_batches {layout.micro_batches}")
        if layout.schedule not in SCHEDULES:
            raise UserError(f"--schedule {layout.schedule!r}: choose one of {', '.join(SCHEDULES)}")
    # interleaved 1F1B: v equal chunks a rank, micro-batches in groups of p
    v = layout.virtual_stages
    if v < 1:
        raise UserError(f"--virtual_stages {v} must be at least 1")
    if v > 1 and (pp < 2 or layout.schedule != "1f1b"):
        raise UserError(
            f"--virtual_stages {v} interleaves the 1f1b schedule over pipeline ranks, and here --pp is {pp} with "
            f"--schedule {layout.schedule}: pass --pp 2 or more with --schedule 1f1b, or leave out --virtual_stages"
        )
    if v > 1 and gpt_config.n_layer % (pp * v):
        raise UserError(
            f"--virtual_stages {v} cuts n_layer {gpt_config.n_layer} into pp x v = {pp * v} equal chunks: choose "
            f"--n_layer a multiple of {pp * v}"
        )
    if v > 1 and layout.micro_batches % pp:
        raise UserError(
            f"--virtual_stages {v} runs micro-batches through each chunk in groups of pp = {pp}, and --micro_batches "
            f"is {layout.micro_batches}: choose a multiple of {pp}"
        )
    # fp16's loss scaling skips a step whose gradients overflowed: every rank must see all of them to agree
    sharded = layout.zero or layout.dp_mode == "fsdp"
    if (pp > 1 or sharded) and dtype == torch.float16:
        raise UserError(
            "the compute dtype is float16 here (--dtype float16, or --dtype auto on a GPU without bf16), which "
            f"needs loss scaling, whose overflow check the {'pipeline' if pp > 1 else 'sharded'} path lacks (under "
            "ZeRO or FSDP a rank sees only its shard of the gradients, and the ranks could disagree on skipping a "
            "step): pass --dtype bfloat16 or float32"
        )
    # the grid: every size at least 1, and one process per rank of dp x pp x cp x tp
    check_grid(layout, world_size)


def model_for_rank(
    whole, grid, layout, batch_size, dtype=torch.float32, autocast=contextlib.nullcontext(), compile=False
):
    """The model as this rank holds it (a layout.RankModel), cut from the whole single-device GPT by the layout
    (a Layout, checked first): under --dp_mode ddp or fsdp, torch's own engine; else each parallelism in turn,
    in place, innermost first: TP's slices, CP's positions, PP's stages, then the DP engine of --dp_mode, or
    ZeRO's of --zero, over what this rank holds. dtype: the compute dtype that autocast runs (fp16 is refused
    where its loss scaling cannot work)."""
    check_layout(layout, whole.config, batch_size, grid.world_size, dtype)
    if layout.dp_mode in TORCH_ENGINES:  # torch's engines are the machinery's: machinery.job.torch_engines.rank_model
        raise ValueError(
            f"--dp_mode {layout.dp_mode}: torch's engine, which machinery.job.torch_engines.rank_model builds"
        )
    whole.recompute = layout.recompute
    cuts = tensor_parallel(whole, grid, layout.sequence_parallel)  # TP: {name: Cut} of this rank's slices; {} at tp 1
    positions = context_parallel(whole, grid, layout.sequence_parallel)  # CP: its positions of each sequence, or None
    module = whole
    if layout.pp > 1:  # PP: only this rank's stages, v chunks when interleaved; the activations between them cut by SP
        sequence_shards = grid.tp if layout.sequence_parallel else 1
        module = PipelineRank(whole, grid.pp_rank, grid.pp, layout.virtual_stages, sequence_shards)
    average_over_cp(module.parameters(), grid)  # before the DP engine's hooks: it averages the cp mean
    dp = data_parallel_engine(layout, module, grid)
    if layout.pp > 1:
        return PipelineModel(module, grid, cuts, positions, dp, layout, whole.config.n_embd, autocast)
    return ShardedModel(module, grid, cuts, positions, dp, layout.zero_stage, autocast, compile)


def data_parallel_engine(layout, module, grid):
    """The hand-written DP engine the layout names (ZeRO's stage, or --dp_mode's) over the grid's dp group, or None
    when dp is 1. A pipeline stage's gradients are complete only when its schedule ends: there (overlap=False) every
    bucket is launched in finish()."""
    if grid.dp == 1:
        return None
    if layout.zero:
        return ZERO_STAGES[layout.zero](module, grid, overlap=layout.pp == 1, bucket_mb=layout.bucket_mb)
    if layout.dp_mode == "bucketed":
        return BucketedDataParallel(module, grid, overlap=layout.pp == 1, bucket_mb=layout.bucket_mb)
    if layout.dp_mode == "naive":
        return NaiveDataParallel(module, grid)
    raise ValueError(f"--dp_mode {layout.dp_mode!r}: no engine")  # check_layout names the choices first
