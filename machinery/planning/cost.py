"""What a pretraining run costs, and how to cut it across a cluster: the cost account and the layout planner.

    python -m machinery.cost --model 70B --tokens 2T --gpu A100 --gpus 2048 --mfu 0.4
    python -m machinery.cost --model 70B --gpu H100 --gpus 8          # does it fit on one node, and how?
    python -m machinery.cost --model 124M --gpu H100 --gpus 1         # tokens: Chinchilla's 20 per parameter
    python -m machinery.cost --model 7B --tokens 2T --gpu H100 --gpus 1024 --json

The account, top to bottom:
  parameters N   from the model's shape, by the formula of model.py's GPT (tested against it)
  tokens D       --tokens, or ~20 per parameter (Chinchilla, Hoffmann et al. 2022)
  FLOPs          6 N D: per parameter and token, 2 forward and 4 backward; plus attention
  memory/GPU     16 B per parameter held (fp32 weights, gradients and AdamW's two moments; the
                 same 16 B as bf16 weights and gradients with fp32 master weights and moments),
                 divided by tp x pp; plus the activations of the micro-batches in flight
  step time      the compute at an assumed MFU, the pipeline bubble, and the communication of
                 each dimension on the link it crosses (NVLink inside a node, the network between)
  cost           GPU-hours x $ per GPU-hour
and when to checkpoint, given how often a device fails (Young/Daly).

Its pieces: the closed forms (closed_forms.py), the planner (planner.py), and here the named shapes, the account a
run prints at its start (`account_lines`) and the command line.
"""

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace

from errors import UserError
from machinery.planning.closed_forms import (
    flops_per_token,
    fullest_rank_state_bytes,
    memory_per_gpu,
    parameters_on_rank,
    state_bytes_formula,
)
from machinery.planning.planner import (
    GPU_ALIASES,
    GPUS,
    CheckpointPlan,
    Plan,
    checkpoint_economics,
    long_context_rows,
    measure_cpu,
    min_model_parallel,
    rank_layouts,
)
from model import GPTConfig

# ----------------------------------------------------------------------------
# Published shapes


@dataclass(frozen=True)
class NamedModel:
    gpt_config: GPTConfig
    batch_tokens: int  # tokens per optimizer step in the published run (4M: 2^22)
    source: str


# Published shapes, in our GPT's two families: GPT-2/GPT-3's (4C GELU MLP, tied embeddings, learned positions),
# and Llama's (SwiGLU MLP of its own hidden size, an untied head, rotary positions, grouped-query attention from
# 70B on), whose counts equal the published ones (6.74B, 13.0B, 69.0B, 405.9B).
def _llama(n_layer, n_head, n_kv_head, n_embd, mlp_hidden, block_size, vocab_size):
    return GPTConfig(
        arch="llama", n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, n_embd=n_embd, mlp_hidden=mlp_hidden,
        block_size=block_size, vocab_size=vocab_size, tie_embeddings=False,
    )  # fmt: skip


MODELS = {
    "tiny": NamedModel(
        GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=256),
        16 * 128,
        "this project's default run",
    ),
    "124M": NamedModel(
        GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
        2**19,
        "GPT-2 small / GPT-3 Small",
    ),
    "350M": NamedModel(
        GPTConfig(n_layer=24, n_head=16, n_embd=1024, block_size=2048, vocab_size=50257), 2**19, "GPT-3 Medium"
    ),
    "1.3B": NamedModel(
        GPTConfig(n_layer=24, n_head=16, n_embd=2048, block_size=2048, vocab_size=50257), 2**20, "GPT-3 XL"
    ),
    "7B": NamedModel(_llama(32, 32, 32, 4096, 11008, 4096, 32000), 2**22, "Llama 2 7B"),
    "13B": NamedModel(_llama(40, 40, 40, 5120, 13824, 4096, 32000), 2**22, "Llama 2 13B"),
    "70B": NamedModel(_llama(80, 64, 8, 8192, 28672, 4096, 32000), 2**22, "Llama 2 70B"),
    "175B": NamedModel(
        GPTConfig(n_layer=96, n_head=96, n_embd=12288, block_size=2048, vocab_size=50257), 1536 * 2048, "GPT-3"
    ),
    "405B": NamedModel(_llama(126, 128, 8, 16384, 53248, 8192, 128256), 2048 * 8192, "Llama 3.1 405B"),
}


# ----------------------------------------------------------------------------
# The account of a run, for train.py


def account_lines(
    gpt_config,
    layout,
    micro_batch_rows,
    in_flight,
    max_iters,
    tokens_per_step,
    activation_bytes,
    step_seconds,
    usd_per_gpu_hour=2.0,
    measured_activations=None,
):
    """Lines of a run's cost account before it trains: compute, memory per device, and time.
    measured_activations: the peak bytes autograd kept in a measured step (monitor.SavedActivations)."""
    N, tokens = parameters_on_rank(gpt_config), max_iters * tokens_per_step
    flops = flops_per_token(gpt_config) * tokens
    # fused_ring=False: this run's own ring attention keeps its merges
    memory = memory_per_gpu(gpt_config, layout, micro_batch_rows, in_flight, activation_bytes, fused_ring=False)
    h100_hours = flops / (0.4 * GPUS["H100"].peak_flops) / 3600
    gib = 2**30
    return [
        f"parameters: {N / 1e6:.2f}M; planned tokens: {tokens / 1e6:.1f}M ({tokens / N:.1f} per parameter)",
        f"training compute: {flops:.3g} FLOPs (6 N D = {6 * N * tokens:.3g}, plus attention)",
        f"memory per device: weights + grads + AdamW {memory.state / gib:.3f} GiB "
        f"({state_bytes_formula(layout.dp, layout.zero_stage)} per parameter held) + activations "
        f"~{memory.activations / gib:.3f}"
        + (" (recomputed)" if layout.recompute else "")
        + (f"; measured in one step: {measured_activations / gib:.3f}" if measured_activations is not None else ""),
        f"measured forward + backward: {step_seconds * 1e3:.0f} ms per step "
        f"-> ~{step_seconds * max_iters / 60:.1f} min for {max_iters} steps on this device",
        f"the same FLOPs on one H100 at 40% MFU: {h100_hours:.3g} GPU-hours "
        f"(~${usd_per_gpu_hour * h100_hours:.3g} at ${usd_per_gpu_hour:g}/GPU-hour)",
    ]


def print_long_context(gpt_config, name, ways, micro_batch_rows):
    """--long_context N (python -m machinery.cost): long_context_rows from 4K to 512K tokens as a table."""
    lengths = [2**k for k in range(12, 20)]  # 4K to 512K tokens
    rows = long_context_rows(gpt_config, ways, lengths, micro_batch_rows)
    h, kv = gpt_config.n_embd, gpt_config.kv_width
    print(f"model {name}, one sequence cut {ways} ways, {micro_batch_rows} a micro-batch, bf16, no recomputation:")
    print("per rank, GB: the activations a step keeps | the payload it hands to collectives in a step (TP's, or CP's")
    print("ring and gradient average; tp+sp's gathers and scatters each count whole: on a ring, tp's traffic)")
    print(f"{'T':>8} {'tp':>9} {'tp+sp':>9} {'cp':>9} | {'tp':>9} {'tp+sp':>9} {'cp':>9}")
    for row in rows:
        act, comm = row["activations"], row["comm"]
        print(
            f"{row['T']:>8,} {act['tp'] / 1e9:>9.1f} {act['tp+sp'] / 1e9:>9.1f} {act['cp'] / 1e9:>9.1f} | "
            f"{comm['tp'] / 1e9:>9.1f} {comm['tp+sp'] / 1e9:>9.1f} {comm['cp'] / 1e9:>9.1f}"
        )
    state = rows[0]["state"]
    crossover = next((row["T"] for row in rows if row["comm"]["cp"] < row["comm"]["tp"]), None)
    print(
        f"cp keeps 4 (h - kv)(n - 1)/n = {4 * (h - kv) * (ways - 1) / ways:,.0f} B a position and layer less than "
        f"tp+sp (h {h}, kv {kv}: {'GQA' if kv < h else 'no GQA, so equal'}); it sends less from T = "
        + (f"{crossover:,}" if crossover else "beyond 512K")
        + f" on than tp (its ring grows with T, its gradient average does not); but each cp rank keeps the whole "
        "training "
        f"state, {state['cp'] / 1e9:,.0f} GB against tp's {state['tp'] / 1e9:,.0f} GB: cp goes beside tp (and ZeRO), "
        "not instead of it"
    )


# ----------------------------------------------------------------------------
# The command line


def parse_count(text, flag):
    """'2T', '300B', '1.5M', '20k' or '1e9' -> a number."""
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    try:
        value = float(text[:-1]) * scale[text[-1].upper()] if text[-1].upper() in scale else float(text)
    except (ValueError, IndexError):
        raise UserError(f"{flag} {text!r}: give a number, optionally with K, M, B or T (2T = 2e12)") from None
    if not 0 < value < math.inf:
        raise UserError(f"{flag} {text}: must be positive and finite")
    return value


SHAPE = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
LLAMA_SHAPE = ("arch", "n_kv_head", "mlp_hidden", "tie_embeddings")  # what a Llama shape adds, as printed


def model_config(args):
    """(GPTConfig, tokens per step) of --model, with any shape flags applied over it, or of the shape flags."""
    if args.model is not None:
        if args.model not in MODELS:
            raise UserError(
                f"--model {args.model!r}: choose one of {', '.join(MODELS)}, or give --n_layer --n_head "
                "--n_embd (--vocab_size --block_size) instead"
            )
        named = MODELS[args.model]
        return replace(
            named.gpt_config, **{k: v for k, v in vars(args).items() if k in SHAPE and v is not None}
        ), named.batch_tokens
    missing = [f"--{k}" for k in ("n_layer", "n_head", "n_embd") if getattr(args, k) is None]
    if missing:
        raise UserError(f"give --model (one of {', '.join(MODELS)}) or the shape: {', '.join(missing)} missing")
    shape = {k: v for k, v in vars(args).items() if k in SHAPE and v is not None}
    return GPTConfig(**{"vocab_size": 50257, "block_size": 1024, **shape}), 2**19


def hardware(args, gpt_config, batch_rows):
    if args.gpu.lower() == "cpu":  # measured at one micro-batch (at most 4096 rows of the matmul)
        return measure_cpu(gpt_config, min(4096, args.micro_batch_rows * gpt_config.block_size), args.gpus)
    name = GPU_ALIASES.get(args.gpu, args.gpu)
    if name not in GPUS:
        raise UserError(f"--gpu {args.gpu!r}: choose one of {', '.join([*GPUS, *GPU_ALIASES, 'cpu'])}")
    return GPUS[name]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help=f"a named shape: {', '.join(MODELS)}")
    for name in SHAPE:
        parser.add_argument(f"--{name}", type=int, help="the model's shape (overrides the named one)")
    parser.add_argument("--tokens", help="training tokens, e.g. 2T or 300B (default: 20 per parameter)")
    parser.add_argument("--gpu", default="H100", help=f"{', '.join([*GPUS, *GPU_ALIASES])} or cpu (measured here)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--mfu",
        type=float,
        default=0.4,
        help="the share of peak FLOP/s the run achieves (published runs: 0.35-0.5). The account's "
        "GPU-hours assume it; the planner runs the compute at it and adds each layout's bubble "
        "and communication, so its layouts achieve less",
    )
    parser.add_argument("--usd_per_gpu_hour", type=float, default=2.0, help="rent of one GPU for an hour")
    parser.add_argument(
        "--batch_tokens",
        help="tokens per optimizer step (default: the named model's published run; 2^19 for a custom shape)",
    )
    parser.add_argument("--micro_batch_rows", type=int, default=1, help="sequences per micro-batch")
    parser.add_argument("--recompute", action="store_true", help="recompute activations in backward")
    parser.add_argument(
        "--zero",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="ZeRO stage (train.py --zero): 1 shards AdamW's moments over dp, 2 the gradients too",
    )
    parser.add_argument("--ckpt_write_gbps", type=float, default=10.0, help="GB/s the cluster writes checkpoints at")
    parser.add_argument(
        "--gpu_mtbf_hours",
        type=float,
        default=72000.0,
        help="mean hours between failures of one device (72,000: a 1,000-GPU cluster loses one every 3 days)",
    )
    parser.add_argument("--restart_minutes", type=float, default=10.0, help="minutes to restart after a failure")
    parser.add_argument("--top", type=int, default=10, help="layouts to list")
    parser.add_argument("--json", action="store_true", help="print the account as JSON")
    parser.add_argument(
        "--long_context",
        type=int,
        metavar="N",
        help="instead of the account: activations and bytes per rank against context length, one sequence cut "
        "N ways by tp, tp with sequence parallelism, or cp",
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.long_context:
        try:
            gpt_config, _ = model_config(args)
        except UserError as e:
            sys.exit(f"error: {e}")
        return print_long_context(gpt_config, args.model or "custom", args.long_context, args.micro_batch_rows)
    try:
        report = account(args)
    except UserError as e:
        sys.exit(f"error: {e}")
    if args.json:
        print(json.dumps(json_form(report), indent=1))
    else:
        print_account(report, args.top)


@dataclass
class Account:
    """The whole account of a run on a cluster (what --json prints). The best_layout fields, the
    state on it and the spreads are None when no layout fits."""

    model: str  # --model, or "custom" when shape flags are given
    shape: dict  # n_layer, n_head, n_embd, vocab_size, block_size
    params: int  # N
    tokens: float  # D
    tokens_per_param: float
    train_flops: float  # 6 N D plus attention
    gpu: str
    gpus: int
    mfu: float  # the share of peak FLOP/s the whole run is assumed to achieve
    batch_tokens: int  # per optimizer step, whole sequences
    state_bytes: int  # 16 B per parameter: weights, gradients and AdamW's two moments
    min_model_parallel: int | None  # the fewest devices tp x pp that hold the state; None: no cut up to 4,096
    # the account proper: FLOPs / (peak x MFU), as published runs are reckoned
    gpu_hours: float
    wall_days: float
    cost_usd: float
    usd_per_gpu_hour: float
    # the planner: compute at that MFU plus what its best layout adds (bubble, communication it cannot hide)
    best_layout_wall_days: float | None  # None: no layout fits
    best_layout_gpu_hours: float | None  # None: no layout fits
    best_layout_cost_usd: float | None  # None: no layout fits
    best_layout_achieved_mfu: float | None  # None: no layout fits
    state_gb_best_layout: float | None  # on its fullest device, under --zero; None: no layout fits
    zero1_state_gb_best_layout: float | None  # the same with AdamW's moments sharded over dp; None: no layout fits
    spread: float | None  # throughput of the best layout that fits over the worst's, less 1; None: no layout fits
    spread_tp_in_node: float | None  # the same among those with TP inside a node; None: none of them fits
    checkpoint: CheckpointPlan
    layouts: list[Plan]  # every layout, planned: those that fit first, fastest first


def account(args):
    """The whole Account of the run that args describe."""
    for flag in ("gpus", "micro_batch_rows", "top"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    for flag in ("mfu", "usd_per_gpu_hour", "ckpt_write_gbps", "gpu_mtbf_hours"):
        if not getattr(args, flag) > 0:
            raise UserError(f"--{flag} {getattr(args, flag)}: must be positive")
    if args.restart_minutes < 0:
        raise UserError(f"--restart_minutes {args.restart_minutes}: must not be negative")
    if args.mfu > 1:
        raise UserError(f"--mfu {args.mfu}: a share of the peak, at most 1")
    gpt_config, batch_tokens = model_config(args)
    N = parameters_on_rank(gpt_config)
    tokens = parse_count(args.tokens, "--tokens") if args.tokens else 20 * N
    batch_tokens = parse_count(args.batch_tokens, "--batch_tokens") if args.batch_tokens else batch_tokens
    if batch_tokens < gpt_config.block_size:
        raise UserError(
            f"--batch_tokens {batch_tokens:g}: less than one sequence of block_size {gpt_config.block_size}"
        )
    batch_rows = round(batch_tokens / gpt_config.block_size)
    hw = hardware(args, gpt_config, batch_rows)
    plans = rank_layouts(
        gpt_config, hw, args.gpus, batch_rows, args.micro_batch_rows, args.mfu, args.recompute, args.zero
    )
    fitting = [p for p in plans if p.fits]
    in_node = [p for p in fitting if p.layout.tp <= hw.per_node]  # the sensible cuts: TP on the fast links
    flops = flops_per_token(gpt_config) * tokens
    # The account: FLOPs / (peak x MFU), as published runs are reckoned, MFU being what the whole run
    # achieves. The planner runs the compute alone at that MFU and adds each layout's bubble and the
    # communication it cannot hide: its best layout achieves less (achieved_mfu), and takes longer.
    gpu_hours = flops / (hw.peak_flops * args.mfu) / 3600
    best = fitting[0] if fitting else None
    return Account(
        model=args.model if args.model and not any(getattr(args, k) for k in SHAPE) else "custom",
        shape={k: getattr(gpt_config, k) for k in SHAPE + (LLAMA_SHAPE if gpt_config.arch == "llama" else ())},
        params=N,
        tokens=tokens,
        tokens_per_param=tokens / N,
        train_flops=flops,
        gpu=hw.name,
        gpus=args.gpus,
        mfu=args.mfu,
        batch_tokens=batch_rows * gpt_config.block_size,
        state_bytes=16 * N,
        min_model_parallel=min_model_parallel(gpt_config, hw),
        gpu_hours=gpu_hours,
        wall_days=gpu_hours / args.gpus / 24,
        cost_usd=gpu_hours * args.usd_per_gpu_hour,
        usd_per_gpu_hour=args.usd_per_gpu_hour,
        best_layout_wall_days=tokens / best.tokens_per_s / 86400 if best else None,
        best_layout_gpu_hours=tokens / best.tokens_per_s * args.gpus / 3600 if best else None,
        best_layout_cost_usd=tokens / best.tokens_per_s * args.gpus / 3600 * args.usd_per_gpu_hour if best else None,
        best_layout_achieved_mfu=best.achieved_mfu if best else None,
        state_gb_best_layout=(fullest_rank_state_bytes(gpt_config, best.layout) / 1e9 if best else None),
        zero1_state_gb_best_layout=(
            fullest_rank_state_bytes(gpt_config, replace(best.layout, zero=1)) / 1e9 if best else None
        ),
        spread=best.tokens_per_s / fitting[-1].tokens_per_s - 1 if best else None,
        spread_tp_in_node=in_node[0].tokens_per_s / in_node[-1].tokens_per_s - 1 if in_node else None,
        checkpoint=checkpoint_economics(
            N, args.gpus, args.ckpt_write_gbps * 1e9, args.gpu_mtbf_hours, args.restart_minutes * 60
        ),
        layouts=plans,
    )


def json_form(report):
    """The account as --json prints it: each plan's layout as its dp, tp, pp, zero and recompute beside the plan."""
    account = asdict(report)
    for plan in account["layouts"]:
        layout = plan.pop("layout")
        plan.update({key: layout[key] for key in ("dp", "tp", "pp", "zero", "recompute")})
    return account


def _amount(x):
    """1,871,172 for large numbers, 0.0123 for small ones."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def print_account(report, top):
    gpu_word = f"{report.gpus:,} x {report.gpu}"
    print(f"model {report.model}: {report.params / 1e9:.3g}B parameters ({report.shape})")
    print(
        f"tokens {report.tokens:.3g} ({report.tokens_per_param:.0f} per parameter); training compute "
        f"{report.train_flops:.3g} FLOPs (6 N D plus attention)"
    )
    needs = report.min_model_parallel
    fits_where = (
        "one device holds it whole"
        if needs == 1
        else f"a device holds its share once tp x pp >= {needs}"
        if needs
        else "no cut of up to 4,096 devices fits it"
    )
    print(f"weights + gradients + AdamW: {_amount(report.state_bytes / 1e9)} GB at 16 B per parameter; {fits_where}")
    print(
        f"at {100 * report.mfu:.0f}% MFU on {gpu_word}: {_amount(report.gpu_hours)} GPU-hours, "
        f"{_amount(report.wall_days)} days, ${_amount(report.cost_usd)} at ${report.usd_per_gpu_hour:g}/GPU-hour"
    )
    if report.best_layout_wall_days is None:
        print(
            f"does not fit on {gpu_word}: no layout holds the model; {fits_where} (without ZeRO or offloading). "
            "Layouts considered, fullest device:"
        )
    else:
        print(
            f"the planner's best layout (compute at that MFU, plus its bubble and the communication it cannot "
            f"hide): {_amount(report.best_layout_wall_days)} days, "
            f"{_amount(report.best_layout_gpu_hours)} GPU-hours, ${_amount(report.best_layout_cost_usd)}; "
            f"it achieves {100 * report.best_layout_achieved_mfu:.0f}% MFU"
        )
        if report.state_gb_best_layout > report.zero1_state_gb_best_layout:
            print(
                f"ZeRO-1 (AdamW's moments sharded over dp too) would cut that layout's state from "
                f"{_amount(report.state_gb_best_layout)} to {_amount(report.zero1_state_gb_best_layout)} GB per GPU"
            )
        if report.spread:
            in_node = (
                ""
                if report.spread_tp_in_node is None
                else f"; among those that keep TP inside a node: {100 * report.spread_tp_in_node:.0f}%"
            )
            print(f"best against worst layout that fits: {100 * report.spread:.0f}% more throughput{in_node}")
    print(
        f"{'dp':>5} {'tp':>3} {'pp':>3} {'m':>5} {'fits':>5} {'GB/GPU':>7} {'step s':>8} {'tokens/s':>12}   "
        "seconds per step: compute | bubble | tp | pp | dp"
    )
    for p in report.layouts[:top]:
        parts = " | ".join(f"{p.parts[k]:.3g}" for k in ("compute", "bubble", "tp", "pp", "dp"))
        print(
            f"{p.layout.dp:>5} {p.layout.tp:>3} {p.layout.pp:>3} {p.micro_batches:>5} {'yes' if p.fits else 'no':>5} "
            f"{p.memory_gb_per_gpu:>7.1f} {p.step_seconds:>8.3g} {p.tokens_per_s:>12,.0f}   {parts}"
        )
    c = report.checkpoint
    print(
        f"checkpoints: {c.checkpoint_gb:,.0f} GB, {c.save_seconds:.0f} s to write; the cluster fails every "
        f"{c.cluster_mtbf_hours:.1f} h; checkpoint every {c.interval_minutes:.0f} min (Young/Daly), "
        f"losing {100 * c.goodput_lost:.1f}% of the time to saves, redone steps and restarts"
    )


if __name__ == "__main__":
    main()
