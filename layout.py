"""The layout: how the ranks share the model out, checked in one place, and the model as this rank holds it.

A layout is the ParallelConfig's flags (--dp, --tp, --pp, --dp_mode, --bucket_mb, --zero, --micro_batches,
--schedule, --recompute). Two functions hold all of it:

    check_layout(layout, gpt_config, batch_size, world_size, dtype)   every rule, in one order, naming the flag
    model_for_rank(whole, grid, layout, batch_size, dtype)            the model as this rank holds it (RankModel)

train.py never asks which layout it runs on: run_setup.py checks the layout before any process group exists
(a collective would wait forever for a peer that refused) and builds the rank's model here, and everything
after talks to the RankModel interface.
"""

import contextlib

import torch

from parallel import BucketedDataParallel, NaiveDataParallel, ShardedModel, check_grid, data_parallel
from pipeline import SCHEDULES, PipelineModel
from torch_engines import DDPModel, FSDPModel
from zero import Zero1DataParallel, Zero2DataParallel

HAND_WRITTEN = ("bucketed", "naive")  # --dp_mode: parallel.py's engines
TORCH_ENGINES = ("ddp", "fsdp")  # --dp_mode: torch's own (torch_engines.py), pure data parallelism
ZERO_STAGES = {1: Zero1DataParallel, 2: Zero2DataParallel}  # --zero: zero.py (stage 3 is --dp_mode fsdp)


def check_layout(layout, gpt_config, batch_size, world_size, dtype):
    """Name a layout (a ParallelConfig) that cannot work for this model (a GPTConfig), batch_size rows per
    micro-step, world_size processes and the compute dtype, before any process group exists. The engine
    first (it decides which other flags may combine), then the cuts, then the processes to launch."""
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    # data parallelism: ours, or torch's engines, which are pure data parallelism
    if layout.dp_mode not in (*HAND_WRITTEN, *TORCH_ENGINES):
        choices = f"{', '.join(HAND_WRITTEN)}, {' or '.join(TORCH_ENGINES)}"
        raise ValueError(f"--dp_mode {layout.dp_mode!r}: choose {choices}")
    if layout.dp_mode in TORCH_ENGINES and (tp > 1 or pp > 1):
        raise ValueError(
            f"--dp_mode {layout.dp_mode} is torch's pure data parallelism and needs --tp 1 --pp 1, got --tp {tp} "
            f"--pp {pp}: pass --dp_mode bucketed (or naive) to combine data parallelism with --tp or --pp"
        )
    # ZeRO: the state shared out over the dp ranks, built on the bucketed gradients
    if layout.zero not in (0, *ZERO_STAGES):
        raise ValueError(
            f"--zero {layout.zero}: choose 1 (AdamW's moments sharded over the dp ranks), 2 (the gradients too) or 0; "
            "stage 3, the weights sharded too, is torch's FSDP2: --dp_mode fsdp"
        )
    if layout.zero and dp == 1:
        raise ValueError(
            f"--zero {layout.zero} shares the training state out over the data-parallel ranks, and --dp is 1: "
            "pass --dp 2 or more, or leave out --zero"
        )
    if layout.zero == 2 and pp > 1:
        raise ValueError(
            "--zero 2 keeps only a shard of each gradient, reduced as backward completes it; a pipeline stage runs "
            "backward once per micro-batch, so its whole gradient piles up until the schedule ends anyway: pass "
            "--zero 1 with --pp"
        )
    if layout.zero and layout.dp_mode != "bucketed":
        raise ValueError(
            f"--zero {layout.zero} is built on the bucketed gradients: leave out --dp_mode {layout.dp_mode}"
        )
    # tensor parallelism: heads are the unit of the cut (n_embd = n_head x head size, so n_embd follows);
    # the vocabulary never blocks it, as it is padded to a multiple of tp (tp < 1: check_grid names it below)
    if tp >= 1 and gpt_config.n_head % tp:
        raise ValueError(
            f"n_head {gpt_config.n_head} is not divisible by tp {tp}: choose --tp among the divisors "
            f"of n_head, or --n_head a multiple of {tp} (with --n_embd a multiple of it)"
        )
    if tp >= 1 and gpt_config.kv_heads % tp:  # GQA: each rank keeps the key/value heads its query heads read
        raise ValueError(
            f"n_kv_head {gpt_config.kv_heads} is not divisible by tp {tp}: each rank holds n_kv_head / tp key/value "
            f"heads; choose --tp among the divisors of n_kv_head, or --n_kv_head a multiple of {tp}"
        )
    if tp >= 1 and gpt_config.hidden % tp:
        raise ValueError(f"the MLP's hidden width {gpt_config.hidden} is not divisible by tp {tp}: set --mlp_hidden")
    # pipeline parallelism: every stage at least one block, every micro-batch the same size
    if gpt_config.n_layer < pp:
        raise ValueError(
            f"n_layer {gpt_config.n_layer} < pp {pp}: every pipeline stage needs at least one block; "
            "lower --pp or raise --n_layer"
        )
    if pp > 1:
        if layout.micro_batches < 1:
            raise ValueError(f"--micro_batches {layout.micro_batches} must be at least 1")
        if batch_size % layout.micro_batches:
            raise ValueError(f"batch_size {batch_size} is not divisible by micro_batches {layout.micro_batches}")
        if layout.schedule not in SCHEDULES:
            raise ValueError(f"--schedule {layout.schedule!r}: choose one of {', '.join(SCHEDULES)}")
    # fp16's loss scaling skips a step whose gradients overflowed: every rank must see all of them to agree
    sharded = layout.zero or layout.dp_mode == "fsdp"
    if (pp > 1 or sharded) and dtype == torch.float16:
        raise ValueError(
            "the compute dtype is float16 here (--dtype float16, or --dtype auto on a GPU without bf16), which "
            f"needs loss scaling, whose overflow check the {'pipeline' if pp > 1 else 'sharded'} path lacks (under "
            "ZeRO or FSDP a rank sees only its shard of the gradients, and the ranks could disagree on skipping a "
            "step): pass --dtype bfloat16 or float32"
        )
    # the grid: every size at least 1, and one process per rank of dp x pp x tp
    check_grid(dp, tp, pp, world_size)


def model_for_rank(
    whole, grid, layout, batch_size, dtype=torch.float32, autocast=contextlib.nullcontext(), compile=False
):
    """The model as this rank holds it (a parallel.RankModel), cut from the whole single-device GPT by the layout
    (a ParallelConfig, checked first): under --dp_mode ddp or fsdp, torch's own engine; else a pipeline stage when
    pp > 1, or every layer (whole, or TP slices), with the DP engine of --dp_mode, or ZeRO's of --zero. dtype: the
    compute dtype that autocast runs (fp16 is refused where its loss scaling cannot work)."""
    check_layout(layout, whole.config, batch_size, grid.world_size, dtype)
    whole.recompute = layout.recompute
    if layout.dp_mode == "ddp":
        return DDPModel(whole, grid, autocast, compile, layout.bucket_mb)
    if layout.dp_mode == "fsdp":
        return FSDPModel(whole, grid, autocast, compile)
    if layout.zero:
        make_dp = data_parallel(ZERO_STAGES[layout.zero], bucket_mb=layout.bucket_mb)
    elif layout.dp_mode == "bucketed":
        make_dp = data_parallel(BucketedDataParallel, bucket_mb=layout.bucket_mb)
    elif layout.dp_mode == "naive":
        make_dp = data_parallel(NaiveDataParallel)
    else:
        raise ValueError(f"--dp_mode {layout.dp_mode!r}: no engine")  # check_layout names the choices first
    if grid.pp > 1:
        return PipelineModel(whole, grid, layout.schedule, layout.micro_batches, autocast, make_dp)
    return ShardedModel(whole, grid, autocast, compile, make_dp)
