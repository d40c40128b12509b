"""Tokens/s and MFU of GPT-2 small (124M) training steps on a GPU: bf16, torch.compile, fused AdamW, flash attention.

    python bench/gpu_speed.py                      # every visible GPU: one alone, then all of them data-parallel
    python bench/gpu_speed.py --arch llama         # its Llama-family twin: RoPE, SwiGLU, grouped-query attention
    python bench/gpu_speed.py --batch_sizes 8,16   # other per-GPU batch sizes (sequences of 1024 tokens)
    python bench/gpu_speed.py --attention cudnn --profile    # cuDNN's attention kernel; where a step's time goes
    python bench/gpu_speed.py --device cpu --compile false   # a tiny shape on the CPU: what the tests run

Each row times train.py's optimizer_step (forward and backward under bf16 autocast,
the DP all-reduce, clipping, fused AdamW) on random tokens, after warm-up steps
that absorb compilation. MFU is the model FLOPs per token (closed_forms.flops_per_token:
6N plus attention) times tokens/s, over the GPUs' dense bf16 peak (cost.py's table,
or --peak_tflops). Attention runs through PyTorch's flash kernel only (the other
SDPA kernels are switched off, so a shape flash cannot take is an error, not a
silent fallback), or --attention cudnn (cuDNN's fused kernel only), or auto
(PyTorch's own choice, which is what train.py gets). A batch size that does not fit in memory says so, and larger
ones are skipped. With several GPUs the same steps run again over NCCL on all of
them, with our bucketed data parallelism (data_parallel.BucketedDataParallel): per-GPU tokens/s
against the single GPU's is the scaling efficiency.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from machinery.components import run_setup  # noqa: E402
from machinery.job import config  # noqa: E402
from machinery.job.local_ranks import results_of, run_ranks  # noqa: E402
from machinery.planning import closed_forms, planner  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from parallel.grid import Layout, ProcessGrid, destroy_distributed, init_distributed  # noqa: E402
from parallel.layout import model_for_rank  # noqa: E402

# the gpt2-small preset: its model fields, the vocabulary padded as train.py pads it
GPT2 = GPTConfig(
    vocab_size=50304, **{k: v for k, v in config.PRESETS["gpt2-small"].items() if k in GPTConfig.__dataclass_fields__}
)
# its Llama-family twin at the same depth, width and context: RoPE, a SwiGLU MLP of hidden 2048 (3 x 768 x 2048, the
# parameters of GPT-2's 2 x 768 x 3072), 4 key/value heads for the 12 query heads, RMSNorm without biases
LLAMA = GPTConfig(
    arch="llama", block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_kv_head=4, n_embd=768, mlp_hidden=2048
)
TINY = GPTConfig(block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_embd=64)  # GPT-2's vocabulary, little else
TINY_LLAMA = GPTConfig(arch="llama", block_size=64, vocab_size=50304, n_layer=2, n_head=2, n_kv_head=1, n_embd=64)


def measure(gpt_config, batch_size, steps, warmup, device_name, compile, attention="flash", profile=False):
    """One rank's (tokens/s of the whole group, peak memory GB of this rank), or None when it does not fit.
    Under local_ranks every rank calls it with torchrun's environment set; alone, it is rank 0 of 1."""
    launch = init_distributed(timeout_seconds=1800)
    layout = Layout(dp=launch.world_size)
    grid = ProcessGrid(layout, launch.rank, launch.world_size)
    device = torch.device(launch.device if launch.world_size > 1 else device_name)
    dtype = run_setup.pick_dtype("auto", device)
    preset = {k: v for k, v in config.PRESETS["gpt2-small"].items() if k in config.TrainConfig.__dataclass_fields__}
    cfg = config.TrainConfig(**{**preset, "batch_size": batch_size, "gradient_accumulation_steps": 1})
    torch.manual_seed(0)
    synchronize = lambda: None  # noqa: E731
    if device.type == "cuda":
        only_attention_kernel(attention)
        torch._dynamo.config.automatic_dynamic_shapes = False  # one static graph per batch size, not a dynamic one
        torch.cuda.reset_peak_memory_stats(device)
        synchronize = torch.cuda.synchronize
    try:
        autocast = run_setup.autocast_context(device, dtype)
        model = model_for_rank(GPT(gpt_config).to(device), grid, layout, batch_size, dtype, autocast, compile)
        optimizer = run_setup.make_optimizer(model.module, cfg, device, model.dp)
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

        def next_batch():  # random tokens made on the device: the input pipeline is not what is timed
            tokens = torch.randint(0, 50257, (batch_size, gpt_config.block_size + 1), device=device)
            return tokens[:, :-1], tokens[:, 1:]

        for step in range(warmup + steps):
            if step == warmup:
                synchronize()
                t0 = time.perf_counter()
            loss, _ = train.optimizer_step(model, optimizer, scaler, next_batch, cfg.learning_rate, cfg)
        loss.item()  # waits for the device
        seconds = time.perf_counter() - t0
        if profile and grid.rank == 0:
            print_profile(
                lambda: train.optimizer_step(model, optimizer, scaler, next_batch, cfg.learning_rate, cfg), device
            )
    except torch.OutOfMemoryError:
        return None
    finally:
        destroy_distributed()
    memory = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    return steps * batch_size * gpt_config.block_size * grid.world_size / seconds, memory


def only_attention_kernel(attention):
    """Leave one scaled-dot-product-attention kernel on CUDA (flash or cudnn), or PyTorch's choice (auto)."""
    if attention != "auto":
        torch.backends.cuda.enable_flash_sdp(attention == "flash")
        torch.backends.cuda.enable_cudnn_sdp(attention == "cudnn")
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)


def print_profile(step, device, rows=30):
    """Where one step's time goes: the kernels (GPU) or operators (CPU) that took most of it."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(profile.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda | cpu (a tiny shape)")
    parser.add_argument(
        "--batch_sizes",
        default="",
        help="per-GPU sequences per step, comma-separated (default 16,32,64 on CUDA, 4 on CPU)",
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row (at least 1)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first: compilation happens here")
    parser.add_argument("--compile", type=config.parse_bool, default=True)
    parser.add_argument(
        "--arch",
        default="gpt2",
        choices=("gpt2", "llama"),
        help="GPT-2 small, or its Llama-family twin of the same depth, width and MLP parameters",
    )
    parser.add_argument(
        "--dp",
        type=int,
        default=0,
        help="ranks for the data-parallel rows; 0 = every visible "
        "GPU (no DP rows with one), 1 = none. On CPU: gloo ranks",
    )
    parser.add_argument("--peak_tflops", type=float, default=0.0, help="the device's peak; 0 = look it up")
    parser.add_argument(
        "--attention", default="flash", choices=("flash", "cudnn", "auto"), help="the SDPA kernel on CUDA"
    )
    parser.add_argument(
        "--profile",
        type=config.parse_bool,
        nargs="?",
        const=True,
        default=False,
        help="after the first batch size, print the kernels one step spends most time in",
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: time at least one step")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("error: --device cuda, but PyTorch sees no GPU here; pass --device cpu for the tiny CPU shape")
    gpt_config = {(True, "gpt2"): GPT2, (True, "llama"): LLAMA, (False, "gpt2"): TINY, (False, "llama"): TINY_LLAMA}[
        cuda, args.arch
    ]
    batch_sizes = [int(b) for b in (args.batch_sizes or ("16,32,64" if cuda else "4")).split(",")]
    dp = args.dp or (torch.cuda.device_count() if cuda else 1)
    peak = planner.device_peak_flops(device, args.peak_tflops)
    flops_per_token = closed_forms.flops_per_token(gpt_config)
    name = torch.cuda.get_device_name(device) if cuda else "CPU"
    print(
        f"{name}, torch {torch.__version__}, {str(run_setup.pick_dtype('auto', device)).replace('torch.', '')}, "
        f"compile {args.compile}, fused AdamW, {args.attention + ' attention' if cuda else 'SDPA'}; "
        f"{GPT(gpt_config).num_params() / 1e6:.1f}M parameters, block {gpt_config.block_size}, "
        f"{flops_per_token / 1e9:.3f} GFLOP per token; "
        + (f"peak {peak / 1e12:.0f} TFLOP/s per device" if peak else "no known peak, so no MFU"),
        flush=True,
    )
    unit = "GPU" if cuda else "rank"
    print(f"{unit + 's':>5} {'batch':>6} {'tokens/s':>12} {'per ' + unit:>12} {'MFU':>6} {'peak GB':>8}", flush=True)
    layouts = [1] + ([dp] if dp > 1 else [])
    for world in layouts:
        for batch_size in batch_sizes:
            profile = args.profile and world == 1 and batch_size == batch_sizes[0]
            job = (gpt_config, batch_size, args.steps, args.warmup, args.device, args.compile, args.attention, profile)
            if world == 1:
                result = measure(*job)
            else:  # spawned, not forked: a CUDA context does not survive a fork
                result = results_of(run_ranks(world, measure, *job, timeout=1800, start_method="spawn"))[0]
            if result is None:
                print(f"{world:>5} {batch_size:>6} {'does not fit in memory; larger batches skipped':>40}", flush=True)
                break
            tokens_per_s, memory = result
            mfu = f"{100 * flops_per_token * tokens_per_s / (peak * world):5.1f}%" if peak else "   n/a"
            memory = f"{memory:8.1f}" if memory is not None else "       -"
            print(
                f"{world:>5} {batch_size:>6} {tokens_per_s:>12,.0f} {tokens_per_s / world:>12,.0f} {mfu:>6} {memory}",
                flush=True,
            )
            if cuda:
                torch._dynamo.reset()  # the next batch size compiles afresh
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
