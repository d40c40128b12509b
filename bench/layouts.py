"""Every way to cut 8 ranks into dp x tp x pp, on one model and one global batch: speed, bytes per
dimension, memory per rank and bubble, side by side.

    python bench/layouts.py [--steps 3] [--ranks 8]

The model is 8 blocks of width 128 (8 heads, block 64, bytes), the global batch 32 sequences
(2,048 tokens per step) for every layout; pipelines cut each data-parallel rank's share into
8 micro-batches under 1F1B. Columns, per optimizer step:
  tokens/s      the group's, over the timed steps (see below for what it means here)
  dp/tp/pp MiB  payload bytes each dimension carried, on its busiest rank (comm_count.counted);
                "=" when every rank's count equals the closed form (closed_forms.comm_bytes_per_step)
  state MiB     parameters + gradients + AdamW moments on the fullest rank at an update (fp32: 4 + 4 + 8
                bytes per parameter it holds; monitor.state_bytes)
  ZeRO-1, -2    the same under --zero 1 and --zero 2 (zero.py), which share AdamW's moments, then the
                gradients too, out over the dp ranks: 4 + 4 + 8/dp and 4 + 12/dp bytes per parameter.
                The weights stay whole on every rank; "-" where dp = 1 (nothing to share), and for ZeRO-2
                where pp > 1 (refused: a stage's gradients pile up over its micro-batches anyway)
  act MiB       the peak of what autograd kept for backward on that rank (monitor.SavedActivations)
  sp act        the same with --sequence_parallel, where tp > 1: the norm regions cut to T/tp positions
  cp act, MiB   the same layout with its dp ranks cutting each sequence instead (--cp dp, dp 1, where dp > 1):
                the activations on the fullest rank, and the payload of the cp dimension (ring and gradient
                average), "=" beside it when every rank's count equals the closed form
  bubble        measured idle share of the pipeline's last step, beside (p - 1) / (m + p - 1)

What 8 processes on a 2-core CPU can and cannot say. The bytes, the state memory and the
formula bubble are exact: a cluster running these layouts moves and holds the same. The
activation peaks are the CPU's, and a GPU holds about the same tensors. The tokens/s and
measured bubble are not a cluster's: here the 8 ranks take turns on 2 cores, so a layout's
speed is its total CPU work plus gloo's per-message cost, and a stage "waits" for a core as
often as for its neighbour. On GPUs every rank computes at once and the links differ (NVLink
inside a node, InfiniBand between): there TP's per-layer all-reduces are cheap inside a node
and dear across, PP's bubble costs (p - 1) / (m + p - 1) of the step, and DP's one all-reduce
hides behind backward. A model of a cluster's step time starts from this table's exact bytes
and memory.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from machinery.components import run_setup  # noqa: E402
from machinery.health.monitor import SavedActivations, state_bytes  # noqa: E402
from machinery.job.config import TrainConfig  # noqa: E402
from machinery.job.local_ranks import results_of, run_ranks  # noqa: E402
from machinery.planning.closed_forms import comm_bytes_per_step  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from parallel.comm_count import take_comm_bytes  # noqa: E402
from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed  # noqa: E402
from parallel.layout import model_for_rank  # noqa: E402
from parallel.pipeline import bubble_fraction  # noqa: E402

MODEL = GPTConfig(block_size=64, vocab_size=256, n_layer=8, n_head=8, n_embd=128)
GLOBAL_BATCH, MICRO_BATCHES = 32, 8


def factorizations(ranks):
    """Every (dp, tp, pp) with dp * tp * pp = ranks."""
    return [
        (dp, tp, ranks // (dp * tp))
        for dp in range(ranks, 0, -1)
        if ranks % dp == 0
        for tp in range(1, ranks // dp + 1)
        if (ranks // dp) % tp == 0
    ]


def pipelined(dp, tp, pp, **fields):
    """The Layout of dp x tp x pp this table measures: a pipeline cuts each step into MICRO_BATCHES micro-batches."""
    return Layout(dp=dp, tp=tp, pp=pp, micro_batches=MICRO_BATCHES if pp > 1 else 1, **fields)


def one_rank(layout, steps, gpt_config, accumulation, global_batch, dtype):
    """On one rank: warm up, time `steps` optimizer steps, then measure one more."""
    launch = init_distributed(300)
    try:
        grid = ProcessGrid(layout, launch.rank, launch.world_size)
        torch.manual_seed(0)
        cfg = TrainConfig(
            batch_size=global_batch // (layout.dp * accumulation), gradient_accumulation_steps=accumulation
        )
        autocast = run_setup.autocast_context(torch.device("cpu"), dtype)
        model = model_for_rank(GPT(gpt_config), grid, layout, cfg.batch_size, dtype, autocast)
        optimizer = run_setup.make_optimizer(model.module, cfg, model.device, model.dp)
        state = []  # monitor.state_bytes at the first update, then the hook goes (it would cost the timed steps)

        def measure(*_):
            state.append(state_bytes(model.module, optimizer))
            hook.remove()

        hook = optimizer.register_step_post_hook(measure)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        generator = torch.Generator().manual_seed(grid.dp_rank)

        def next_batch():
            tokens = torch.randint(
                gpt_config.vocab_size, (cfg.batch_size, gpt_config.block_size + 1), generator=generator
            )
            return tokens[:, :-1], tokens[:, 1:]

        train.optimizer_step(model, optimizer, scaler, next_batch, 1e-3, cfg)  # warm-up
        if dist.is_initialized():  # one rank alone has no group
            dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            train.optimizer_step(model, optimizer, scaler, next_batch, 1e-3, cfg)
        seconds = time.perf_counter() - t0
        take_comm_bytes()  # the last step's bytes are counted from zero
        with SavedActivations(model.module) as saved:  # one more step, measured but not timed (hooks cost time)
            train.optimizer_step(model, optimizer, scaler, next_batch, 1e-3, cfg)
        held = sum(p.numel() for p in model.module.parameters())
        closed_form = comm_bytes_per_step(
            gpt_config,
            layout,
            stage=grid.pp_rank,
            batch_size=cfg.batch_size,
            accumulation=accumulation,
            compute_bytes=dtype.itemsize,
        )
        return {
            "grid": (grid.dp_rank, grid.pp_rank, grid.tp_rank),
            "cp_rank": grid.cp_rank,
            "seconds": seconds,
            "parameters": held,
            "bytes": take_comm_bytes(),
            "formula": {d: b for d, (b, _) in closed_form.items()},
            "state": state[0],
            "activations": saved.peak,
            "records": getattr(model, "records", []),
        }
    finally:
        destroy_distributed()


def measure_layout(layout, steps=3, gpt_config=MODEL, accumulation=1, global_batch=GLOBAL_BATCH, dtype=torch.float32):
    """One Layout on its world_size local ranks: a row of the table, as a dict (with each rank's own
    measurements under "ranks"). global_batch sequences per step = dp ranks x accumulation
    micro-steps x the rows of each; dtype is the autocast dtype (float32: none)."""
    args = (layout, steps, gpt_config, accumulation, global_batch, dtype)
    if layout.world_size == 1:  # one process: this one, with all its threads (a forked child must keep to one)
        ranks = [one_rank(*args)]
    else:
        ranks = results_of(run_ranks(layout.world_size, one_rank, *args, timeout=600))
    first = [r for r in ranks if r["grid"][0] == 0 and r["grid"][2] == 0 and r["cp_rank"] == 0]  # one rank a stage
    stages = sorted(first, key=lambda r: r["grid"][1])
    pp, m = layout.pp, layout.pipeline_micro_batches
    return {
        "dp": layout.dp,
        "tp": layout.tp,
        "pp": pp,
        "step_seconds": max(r["seconds"] for r in ranks) / steps,
        "tokens_per_s": steps * global_batch * gpt_config.block_size / max(r["seconds"] for r in ranks),
        "bytes": {d: max(r["bytes"][d] for r in ranks) for d in ("dp", "tp", "pp", "cp")},
        "bytes_equal_formula": all(r["bytes"] == r["formula"] for r in ranks),
        "state": max(r["state"] for r in ranks),
        "activations": max(r["activations"] for r in ranks),
        "bubble": bubble_fraction([r["records"] for r in stages]) if pp > 1 else 0.0,
        "bubble_formula": (pp - 1) / (m + pp - 1),
        "ranks": ranks,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per layout (after one warm-up)")
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    mib = 2**20
    print(
        f"GPT {MODEL.n_layer} blocks x {MODEL.n_embd} wide, global batch {GLOBAL_BATCH} x {MODEL.block_size} "
        f"tokens, m = {MICRO_BATCHES} micro-batches (1F1B) where pp > 1; {args.ranks} ranks on gloo, "
        f"{os.cpu_count()} cores, torch {torch.__version__}"
    )
    print(
        f"{'dp tp pp':>9} {'tokens/s':>9} {'dp MiB':>7} {'tp MiB':>7} {'pp MiB':>7} {'':1} "
        f"{'state MiB':>9} {'ZeRO-1':>7} {'ZeRO-2':>7} {'act MiB':>8} {'bubble':>7} {'formula':>7} "
        f"{'sp act':>7} {'cp act':>7} {'cp MiB':>7}"
    )
    for dp, tp, pp in factorizations(args.ranks):
        row = measure_layout(pipelined(dp, tp, pp), args.steps)
        b = row["bytes"]
        zero = [  # ZeRO-2 is refused with a pipeline (zero.py says why)
            f"{measure_layout(pipelined(dp, tp, pp, zero=stage), 1)['state'] / mib:>7.2f}"
            if dp > 1 and (stage == 1 or pp == 1)
            else f"{'-':>7}"
            for stage in (1, 2)
        ]
        sp = pipelined(dp, tp, pp, sequence_parallel=True)
        sp = f"{measure_layout(sp, 1)['activations'] / mib:>7.2f}" if tp > 1 else f"{'-':>7}"
        if dp > 1:  # the data-parallel ranks cut each sequence instead
            cut = measure_layout(pipelined(1, tp, pp, cp=dp), 1)
            cp = f"{cut['activations'] / mib:>7.2f} {cut['bytes']['cp'] / mib:>7.2f}"
            cp += "=" if cut["bytes_equal_formula"] else "!"
        else:
            cp = f"{'-':>7} {'-':>7}"
        print(
            f"{row['dp']:>3}{row['tp']:>3}{row['pp']:>3} {row['tokens_per_s']:>9,.0f} {b['dp'] / mib:>7.2f} "
            f"{b['tp'] / mib:>7.2f} {b['pp'] / mib:>7.2f} {'=' if row['bytes_equal_formula'] else '!':1} "
            f"{row['state'] / mib:>9.2f} {zero[0]} {zero[1]} {row['activations'] / mib:>8.2f} {row['bubble']:>7.3f} "
            f"{row['bubble_formula']:>7.3f} {sp} {cp}",
            flush=True,
        )
    print(
        f"bytes and state memory are exact for any hardware; tokens/s and the measured bubble are {args.ranks} "
        "processes taking turns on this CPU's cores, not a cluster's (see the top of this file)"
    )


if __name__ == "__main__":
    main()
