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

train.py prints the same account for the run at hand (`account_lines`); the bytes each rank sends per
step (`comm_bytes_per_step`) are what comm_count.counted counts, equal byte for byte in a test.
"""

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

from model import GPTConfig, stage_layers
from parallel.grid import Layout

# ----------------------------------------------------------------------------
# The model: parameters and FLOPs in closed form


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


def parameters_on_rank(gpt_config, layout=Layout(), stage=0):
    """Closed form of the parameters one rank of the layout holds (stage `stage` of pp, a 1/tp slice of its
    matrices); with the defaults, the whole model's count, GPT(gpt_config).num_params().

    A block's matrices are cut by tp, its norms stay whole on every TP rank: attention's q (C^2), k and v
    (C x kv each, kv = C kv_heads / n_head: C^2 each without GQA) and output (C^2); the MLP's two matrices of
    C x hidden (GELU, hidden 4 C: 8 C^2 in all) or three (SwiGLU, llama). So GPT-2's block holds 12 C^2. The
    first stage adds the embedding (its V/tp rows, the vocabulary padded to a multiple of tp) and the learned
    positions (gpt2); the last stage the final norm, and the head's matrix where it is not the first stage's
    embedding itself: a copy of the tied one on a later stage, or an untied head of its own."""
    C, V, H = gpt_config.n_embd, gpt_config.vocab_size, gpt_config.hidden
    kv, tp, pp = gpt_config.kv_width, layout.tp, layout.pp
    mlp_matrices = 3 if gpt_config.arch == "llama" else 2
    norm = 0 if gpt_config.norm == "none" else C * (2 if gpt_config.norm == "layernorm" and gpt_config.bias else 1)
    matrices = C * (C + 2 * kv) + C * C + mlp_matrices * C * H
    column_biases = (C + 2 * kv if gpt_config.bias or gpt_config.qkv_bias else 0) + (
        (mlp_matrices - 1) * H if gpt_config.bias else 0
    )  # cut by tp with their matrices; the row-parallel ones (attention out, MLP down) stay whole
    block = matrices // tp + 2 * norm + column_biases // tp + (2 * C if gpt_config.bias else 0)
    first_block, end_block = stage_layers(gpt_config.n_layer, pp)[stage]
    embedding = -(-V // tp) * C
    n = (end_block - first_block) * block
    if stage == 0:
        n += embedding + (gpt_config.block_size * C if gpt_config.arch == "gpt2" else 0)  # learned positions
    if stage == pp - 1:
        head = embedding if pp > 1 or not gpt_config.tie_embeddings else 0
        n += (norm if gpt_config.norm_position == "pre" else 0) + head
    return n


def whole_parameters_on_stage(gpt_config, pp=1, stage=0):
    """The parameters every TP rank holds whole on a pipeline stage: its blocks' norms and row-parallel biases, the
    learned positions on the first stage, the final norm on the last (parameters_on_rank's uncut part). Under
    sequence parallelism each TP rank's gradient of them comes from its T/tp positions, so they are summed."""
    C = gpt_config.n_embd
    norm = 0 if gpt_config.norm == "none" else C * (2 if gpt_config.norm == "layernorm" and gpt_config.bias else 1)
    first_block, end_block = stage_layers(gpt_config.n_layer, pp)[stage]
    n = (end_block - first_block) * (2 * norm + (2 * C if gpt_config.bias else 0))
    n += gpt_config.block_size * C if stage == 0 and gpt_config.arch == "gpt2" else 0
    return n + (norm if stage == pp - 1 and gpt_config.norm_position == "pre" else 0)


def lookup_parameters(gpt_config):
    """The parameters only looked up, never multiplied: the learned positions (gpt2: T x C; rotary ones have none),
    and the token embedding where the head is a matrix of its own (tied, the same matrix is the head's matmul)."""
    positions = gpt_config.block_size * gpt_config.n_embd if gpt_config.arch == "gpt2" else 0
    return positions + (0 if gpt_config.tie_embeddings else gpt_config.vocab_size * gpt_config.n_embd)


def fullest_rank_parameters(gpt_config, layout):
    """The parameters of the rank that holds the most (the first stage, with the embedding and positions)."""
    return max(parameters_on_rank(gpt_config, layout, s) for s in range(layout.pp))


def flops_per_token(gpt_config):
    """Training FLOPs per token: 6 N for the weight matmuls (2 N forward, 4 N backward), plus 12 L C T
    for attention's q k^T and its weighted sum of v (2 T C each per layer forward, times 3 with
    backward), counted over the full T x T square as the PaLM paper does. A position lookup does no matmul."""
    # exercise flops_per_token: begin
    L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
    return 6 * (parameters_on_rank(gpt_config) - lookup_parameters(gpt_config)) + 12 * L * C * T
    # exercise flops_per_token: end


def comm_bytes_per_step(gpt_config, layout, *, stage, batch_size, accumulation, compute_bytes):
    """Closed form of the bytes a rank of the layout's pipeline stage `stage` hands to each dimension's
    communication in one optimizer step (what comm_count.counted counts), with the step's
    formula: {dimension: (bytes, formula)}.

    B = batch_size rows per micro-step (all of a pipeline's micro-batches together), A
    micro-steps of accumulation, T = the positions of a sequence a rank holds (block_size / cp), C = n_embd,
    L = the stage's blocks. The
    activations cross in fp32, except the row-parallel matmul outputs, which are in the
    compute dtype (compute_bytes: 2 under bf16 or fp16 autocast).
      tp: per block, 2 all-reduces forward (after attention and after the MLP) and 2 backward
          (before them), every micro-step: at every layer. Recomputation adds the attention's one
          again in backward (the MLP's output feeds no tensor backward keeps, and torch's checkpoint
          stops rebuilding once backward has what it needs). Plus the embedding's forward on the
          first stage, the head's backward and the loss's 3 (B, T) reductions (a max, two sums) on
          the last. Under sequence parallelism each all-reduce becomes an all-gather and a reduce-scatter of the
          same (B, T, C) buffer, each counted whole (a ring moves half an all-reduce's bytes for each): per block,
          forward an all-gather (fp32) before each column-parallel layer and a reduce-scatter (compute dtype) after
          each row-parallel one, backward the reverse; recomputation gathers attention's and the MLP's inputs and
          scatters attention's output again. The embedding's reduce-scatter and the head's all-gather (fp32) go both
          ways, and the whole parameters' gradients (norms, positions, row-parallel biases) are summed, fp32, as
          each backward makes them: once per micro-batch of a pipeline (micro_batches), once per micro-step else.
      pp: per micro-step, the activation (B, T, C) to the next stage and its gradient back to
          the one before ((B, T/tp, C) under sequence parallelism): between stages only. Interleaved over v
          chunks a rank (virtual_stages), each chunk sends both, less the model's first and last chunks: 2 v
          on the ranks between, 2 v - 1 on the ends. Plus, once per step, the tied embedding's gradient between
          the first and last stages.
      cp: per block, its keys and values (2 B T kv/tp, compute dtype) passed around the ring cp - 1 times forward
          (again under recomputation) and their gradient cp - 1 times back; and the gradient of every parameter
          the rank holds averaged over the group as each backward makes it (fp32, micro_batches per micro-step).
      dp: once per step, the gradient of every parameter the rank holds, fp32; under ZeRO (zero 1, 2) a
          reduce-scatter of it (ZeRO-2: every micro-step) and an all-gather of the updated weights; under
          FSDP2 (zero 3) its reduce-scatter alone is counted (its all-gathers carry weights, not gradients).
    """
    dp, tp, pp, cp, zero = layout.dp, layout.tp, layout.pp, layout.cp, layout.zero_stage
    recompute, sequence_parallel = layout.recompute, layout.sequence_parallel
    micro_batches, virtual_stages = layout.pipeline_micro_batches, layout.virtual_stages
    B, T, C, A = batch_size, gpt_config.block_size // cp, gpt_config.n_embd, accumulation
    first_block, end_block = stage_layers(gpt_config.n_layer, pp)[stage]
    L, first, last = end_block - first_block, stage == 0, stage == pp - 1
    act = B * T * C  # elements of one (B, T, C) activation
    tp_bytes = pp_bytes = dp_bytes = 0
    tp_how = pp_how = dp_how = "none: a group of 1"
    if tp > 1 and not sequence_parallel:
        per_micro_step = (
            L * act * ((2 + recompute) * compute_bytes + 2 * 4) + first * act * 4 + last * (act * 4 + 3 * B * T * 4)
        )
        tp_bytes = A * per_micro_step
        tp_how = (
            f"A x [L B T C x ({2 + recompute} x {compute_bytes} + 2 x 4) at every layer"
            + (" + B T C x 4 (embedding)" if first else "")
            + (" + B T C x 4 (head) + 3 B T x 4 (loss)" if last else "")
            + f"], A={A} L={L} B={B} T={T} C={C}"
        )
    if tp > 1 and sequence_parallel:
        whole = whole_parameters_on_stage(gpt_config, pp, stage)
        per_layer = (4 + recompute) * compute_bytes + (4 + 2 * recompute) * 4
        per_micro_step = (
            L * act * per_layer + (first + last) * act * 8 + last * 3 * B * T * 4 + micro_batches * whole * 4
        )
        tp_bytes = A * per_micro_step
        tp_how = (
            f"A x [L B T C x ({4 + recompute} x {compute_bytes} + {4 + 2 * recompute} x 4) at every layer"
            + (" + B T C x 8 (embedding)" if first else "")
            + (" + B T C x 8 (head) + 3 B T x 4 (loss)" if last else "")
            + f" + {micro_batches} x {whole:,} x 4 (whole parameters' gradients)], A={A} L={L} B={B} T={T} C={C}"
        )
    if pp > 1:
        neighbours = 2 * virtual_stages - first - last  # sends a micro-step: forward from each chunk but the
        # model's last, backward from each but its first
        tied = (first or last) * gpt_config.tie_embeddings * -(-gpt_config.vocab_size // tp) * C * 4  # its two copies
        pp_bytes = A * neighbours * act // (tp if sequence_parallel else 1) * 4 + tied
        sent = (
            "activations forward and gradients back"
            if neighbours >= 2
            else "activations to the next stage"
            if first
            else "gradients to the stage before"
        )
        pp_how = (
            f"A x {neighbours} x B T C{' / tp' if sequence_parallel else ''} x 4 ({sent})"
            + (f" + V/tp x C x 4 (tied embedding's gradient), V={gpt_config.vocab_size}" if tied else "")
            + f", A={A} B={B} T={T} C={C}"
        )
    if dp > 1:
        held = parameters_on_rank(gpt_config, layout, stage)
        scatters = A if zero == 2 else 1  # ZeRO-2 reduces every micro-step's gradient
        ours = zero in (1, 2)  # FSDP2 (stage 3) counts its reduce-scatters only: its all-gathers carry weights
        dp_bytes = (4 * scatters + 4 if ours else 4) * held
        dp_how = (
            f"{'A x ' if zero == 2 else ''}4 x {held:,} parameters on the rank, reduce-scattered, + 4 x {held:,} "
            "all-gathered, per step (a ring moves (dp - 1)/dp of each: one all-reduce's worth each pair)"
            + (f", A={A}" if zero == 2 else "")
            if ours
            else f"4 x {held:,} parameters on the rank, once per step"
        )
    cp_bytes, cp_how = 0, "none: a group of 1"
    if cp > 1:
        kv = gpt_config.kv_width // tp  # this TP rank's key/value width
        held = parameters_on_rank(gpt_config, layout, stage)
        cp_bytes = A * (L * (cp - 1) * (2 + recompute) * 2 * B * T * kv * compute_bytes + micro_batches * 4 * held)
        cp_how = (
            f"A x [L x (cp - 1) x {2 + recompute} x 2 B T kv x {compute_bytes} (keys and values around the ring) + "
            f"{micro_batches} x 4 x {held:,} parameters (their gradients averaged)], A={A} L={L} B={B} T={T} "
            f"kv={kv} cp={cp}"
        )
    return {"dp": (dp_bytes, dp_how), "tp": (tp_bytes, tp_how), "pp": (pp_bytes, pp_how), "cp": (cp_bytes, cp_how)}


def busiest_stage_comm_bytes(gpt_config, layout, *, batch_size, accumulation, compute_bytes):
    """{dimension: (bytes, formula)} per step, in closed form, of the stage that sends the most in it
    (what train.py logs as comm_bytes_* and prints beside the counts)."""
    per_stage = [
        comm_bytes_per_step(
            gpt_config,
            layout,
            stage=stage,
            batch_size=batch_size,
            accumulation=accumulation,
            compute_bytes=compute_bytes,
        )
        for stage in range(layout.pp)
    ]
    return {
        d: max((stage[d] for stage in per_stage), key=lambda closed_form: closed_form[0])
        for d in ("dp", "tp", "pp", "cp")
    }


# ----------------------------------------------------------------------------
# Hardware

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, matched against the device name.
GPU_PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,
    "T4": 65e12,
}


def device_peak_flops(device, peak_tflops=0.0):
    """FLOP/s the device could do at best, for MFU; None on CPU or an unknown GPU."""
    if peak_tflops > 0:
        return peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None)


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # one device, dense bf16 (the CPU: measured fp32)
    memory: float  # bytes of one device
    intra_bandwidth: float  # bytes/s a device sends to another of its node, one direction (NVLink)
    inter_bandwidth: float  # bytes/s a device sends to another node (its share of the network: InfiniBand, RoCE)
    latency: float  # seconds per message
    per_node: int  # devices per node


# SXM parts in nodes of 8: NVLink 3 (A100) 600 GB/s and NVLink 4 (H100, H200) 900 GB/s both directions
# together; one 200 (A100) or 400 (H100, H200) Gb/s network port per GPU.
GPUS = {
    "A100-40GB": Hardware("A100-40GB", GPU_PEAK_FLOPS["A100"], 40e9, 300e9, 25e9, 10e-6, 8),
    "A100-80GB": Hardware("A100-80GB", GPU_PEAK_FLOPS["A100"], 80e9, 300e9, 25e9, 10e-6, 8),
    "H100": Hardware("H100", GPU_PEAK_FLOPS["H100"], 80e9, 450e9, 50e9, 10e-6, 8),
    "H200": Hardware("H200", GPU_PEAK_FLOPS["H200"], 141e9, 450e9, 50e9, 10e-6, 8),
    # the card of someone training at home: 24 GB, no NVLink (PCIe 4.0 x16, ~25 GB/s each way), 4 to a
    # workstation, 10 Gb/s Ethernet between workstations
    "RTX4090": Hardware("RTX4090", GPU_PEAK_FLOPS["RTX 4090"], 24e9, 25e9, 1.25e9, 20e-6, 4),
}
GPU_ALIASES = {"A100": "A100-80GB"}


def _all_reduce_under_load(sizes, gpt_config, rows, repeats=30):
    """On one of 2 local ranks: the mean time an all-reduce of each size (bytes) adds to a loop
    that also multiplies (rows, C) @ (C, 4C), as a training step interleaves them."""
    import torch.distributed as dist  # only the measurement needs it

    from parallel.grid import destroy_distributed, init_distributed

    init_distributed(60)
    try:
        a, w = torch.randn(rows, gpt_config.n_embd), torch.randn(gpt_config.n_embd, 4 * gpt_config.n_embd)

        def loop(message):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(repeats):
                a @ w
                if message is not None:
                    dist.all_reduce(message)
            return (time.perf_counter() - t0) / repeats

        loop(torch.zeros(1))  # warm-up
        compute = loop(None)
        return [loop(torch.zeros(max(1, size // 4))) - compute for size in sizes]
    finally:
        destroy_distributed()


def measure_cpu(gpt_config, rows, ranks):
    """This machine as a 'GPU': each of `ranks` processes gets cores / ranks threads (as
    parallel.grid.init_distributed gives them). peak_flops: fp32 matmul FLOP/s of that many threads
    at the model's MLP shape, (rows, C) @ (C, 4C). The link: what an all-reduce between 2 local
    processes adds to a loop that also computes, as in training (alone, gloo on loopback is several
    times faster than between two busy processes on shared cores). A 2-rank ring all-reduce is 2
    messages: the latency per message is half a 4-byte all-reduce's time, and the bandwidth is what
    fits the time of one the size of a (rows, C) fp32 activation."""
    from machinery.local_ranks import results_of, run_ranks

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))
    a, w = torch.randn(rows, gpt_config.n_embd), torch.randn(gpt_config.n_embd, 4 * gpt_config.n_embd)
    for _ in range(3):
        a @ w  # warm-up
    t0, repeats = time.perf_counter(), 20
    for _ in range(repeats):
        a @ w
    peak = 2 * rows * gpt_config.n_embd * 4 * gpt_config.n_embd * repeats / (time.perf_counter() - t0)
    torch.set_num_threads(threads)
    message = rows * gpt_config.n_embd * 4
    latency, seconds = results_of(run_ranks(2, _all_reduce_under_load, [4, message], gpt_config, rows // ranks))[0]
    bandwidth = message / max(seconds - latency, 1e-9)  # 2 ranks: a ring all-reduce sends the message once
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # POSIX, as is gloo on loopback here
    return Hardware("cpu", peak, memory, bandwidth, bandwidth, max(latency / 2, 1e-9), os.cpu_count() or 1)


# ----------------------------------------------------------------------------
# A layout: memory per device and step time


def state_bytes_per_parameter(dp=1, zero=0):
    """Bytes of training state per parameter a rank holds: fp32 weights (4), gradients (4) and AdamW's two
    moments (8). ZeRO (zero.py; Rajbhandari et al. 2020) shares out over the dp ranks, stage 1: the moments,
    4 + 4 + 8/dp; stage 2: the gradients too, 4 + 12/dp; stage 3 (FSDP): the weights too, 16/dp. (With bf16
    weights and gradients beside fp32 master weights, the paper's case, stage 1 leaves 4 + 12/dp of 16.)"""
    return {0: 16, 1: 8 + 8 / dp, 2: 4 + 12 / dp, 3: 16 / dp}[zero]


def state_bytes_formula(dp=1, zero=0):
    """state_bytes_per_parameter as a formula, for the printed comparisons: '4 + 4 + 8/2 = 12 B'."""
    terms = {0: "4 + 4 + 8", 1: f"4 + 4 + 8/{dp}", 2: f"4 + 12/{dp}", 3: f"16/{dp}"}[zero]
    return f"{terms} = {state_bytes_per_parameter(dp, zero):g} B"


def fullest_rank_state_bytes(gpt_config, layout):
    """Closed form of the training state on the rank of the layout that holds the most (train.py prints it beside
    monitor.state_bytes at the first update)."""
    return state_bytes_per_parameter(layout.dp, layout.zero_stage) * fullest_rank_parameters(gpt_config, layout)


@dataclass(frozen=True)
class Memory:
    """Bytes on the fullest device of a layout (memory_per_gpu)."""

    state: float  # weights, gradients and AdamW's two moments: 16 B per parameter held, less what ZeRO shares out
    activations: float  # what backward keeps: the micro-batches in flight, plus the logits of one

    @property
    def total(self):
        return self.state + self.activations


def memory_per_gpu(gpt_config, layout, micro_batch_rows, in_flight, activation_bytes=2, fused_ring=True):
    """Bytes on the fullest device of a layout, as a Memory.

    state: 16 B per parameter held (the stage with the embedding holds the most), less what ZeRO's
    stage (the layout's zero_stage) shares out over the dp ranks (state_bytes_per_parameter).
    activations: per layer and micro-batch of b rows, s b h (10 + 24/t) bytes at 16 bits under TP
    of t without sequence parallelism (Korthikanti et al. 2022, whose 5 a s / h more for the
    (s, s) attention scores a fused attention kernel never stores: model.py calls SDPA), or only
    the layer's input, 2 s b h, with full recomputation. Their 24 h is what TP cuts: q, k, v and
    attention's output (2 h each; k and v 2 kv each under GQA), and the MLP's hidden activations,
    GELU's input and output (2 x 2 H, H = 4 h) or SwiGLU's gate, up, SiLU(gate) and product (4 x 2 H),
    and under RoPE the rotated copies of q and k (2 h + 2 kv). Their 10 h is what TP leaves whole: the norms'
    inputs (4 h), dropout's masks (2 h), and the inputs of the column-parallel layers (4 h). Sequence
    parallelism cuts the first two by position, 4 h + 6 h/t; the gathered inputs stay whole, as autograd keeps
    them (Megatron gathers them again in backward to cut them too);
    times the stage's layers, times the micro-batches in flight (1F1B: p on the first stage, at most m;
    GPipe: all m), plus the logits of one. Context parallelism (cp) gives a rank s / cp positions of all of it,
    plus the K and V blocks the ring brings, kept for their backward: 4 kv (cp - 1) / tp a position, as a fused
    ring kernel keeps them (fused_ring). context_parallel.ring_attention, written to be read, rebuilds each block's
    scores in backward too, but autograd keeps every merge's running output and block output, fp32: 8 h (cp - 1) / tp
    bytes a position more on the ring's last rank, whose every step merges a whole block (fused_ring=False)."""
    tp, pp, cp, recompute, sequence_parallel = (
        layout.tp,
        layout.pp,
        layout.cp,
        layout.recompute,
        layout.sequence_parallel,
    )
    state = fullest_rank_state_bytes(gpt_config, layout)
    s, b, h = gpt_config.block_size // cp, micro_batch_rows, gpt_config.n_embd
    kv = gpt_config.kv_width
    llama = gpt_config.arch == "llama"
    mlp = (8 if llama else 4) * gpt_config.hidden
    rope = 2 * h + 2 * kv if llama else 0  # the rotated q and k: copies attention keeps beside q, k, v's own
    left_whole = 4 * h + 6 * h / tp if sequence_parallel else 10 * h
    cut_by_position = tp if sequence_parallel else 1  # a recomputed layer keeps its input: T/tp positions under SP
    ring = 4 * kv * (cp - 1)  # the K and V blocks received from the other cp - 1 ranks (their TP slice: / tp below)
    per_layer = (
        2 * s * b * h / cut_by_position
        if recompute
        else s * b * (left_whole + (4 * h + 4 * kv + mlp + rope + ring) / tp)
    )
    layers = max(end - first for first, end in stage_layers(gpt_config.n_layer, pp))
    # in the compute dtype, and the loss's fp32 copy
    logits = b * s * -(-gpt_config.vocab_size // tp) * (activation_bytes + 4)
    activations = in_flight * layers * per_layer * activation_bytes / 2 + logits
    if not (fused_ring or recompute):  # recomputation keeps a layer's input alone, ring and merges rebuilt
        activations += in_flight * layers * s * b * 8 * h * (cp - 1) / tp
    return Memory(state, activations)


@dataclass
class Plan:
    layout: Layout  # dp x tp x pp, with the recomputation and ZeRO stage planned
    micro_batches: int  # per optimizer step on each dp rank: a pipeline's micro-batches, or accumulation steps
    fits: bool
    memory_gb_per_gpu: float
    step_seconds: float
    tokens_per_s: float
    achieved_mfu: float  # the layout's step, with its bubble and communication, against the devices' peak
    parts: dict  # seconds per step: compute, bubble, tp, pp, dp (the part backward does not hide)


def plan_layout(gpt_config, hw, layout, batch_rows, micro_batch_rows, mfu, compute_bytes=2):
    """The step time and memory of one layout of dp x tp x pp devices, batch_rows sequences per step.

    Each dp rank runs batch_rows / dp rows as m micro-batches of micro_batch_rows (a pipeline's
    micro-batches, or accumulation steps). Compute runs at mfu x peak, each stage at the pace of the
    slowest (the most blocks, or the head on the last); full recomputation adds a forward (8 N instead
    of 6 N FLOPs per token). Communication, each on the link its group crosses (NVLink while the group
    sits inside one node, the network once it spans nodes), modelled with activations in the compute dtype:
      tp: 4 all-reduces of a (b, T, C) activation per layer and micro-batch (5 with recomputation:
          comm_bytes_per_step says which),
          2 at the ends and the loss's 3 of (b, T), blocking;
      pp: an activation forward and its gradient back per micro-batch;
      dp: the all-reduce of the fp32 gradients, once per step. Without a pipeline it overlaps the
          last micro-step's backward (2/3 of its compute) except its last bucket; with one it starts
          after the schedule. Under ZeRO its two halves come apart: the reduce-scatter overlaps as the
          all-reduce did (ZeRO-2: one per micro-batch, each with its own backward), the all-gather of the
          updated weights waits for the update. A pipeline's layouts get ZeRO-1 when ZeRO-2 is asked.
    Memory: the state under the layout's ZeRO stage (state_bytes_per_parameter), and the activations.
    The bubble: a pipeline idles p - 1 micro-batch slots, each the slowest stage's compute and
    communication for one micro-batch: (p - 1) / (m + p - 1) of the step when communication is free.
    A ring all-reduce of P bytes over n devices sends 2 (n - 1) / n P per device in 2 (n - 1) messages."""
    if layout.zero == 2 and layout.pp > 1:  # layout.check_layout refuses ZeRO-2 with a pipeline (zero.py says why)
        layout = replace(layout, zero=1)
    dp, tp, pp, zero, recompute = layout.dp, layout.tp, layout.pp, layout.zero, layout.recompute
    m = batch_rows // dp // micro_batch_rows
    tokens = batch_rows * gpt_config.block_size // dp  # per dp rank and step
    C, T, V = gpt_config.n_embd, gpt_config.block_size, gpt_config.vocab_size
    stage_flops = [
        (end - first) * (72 * C * C + 12 * C * T) + (s == pp - 1) * 6 * V * C  # per token: blocks, head
        for s, (first, end) in enumerate(stage_layers(gpt_config.n_layer, pp))
    ]
    compute = max(stage_flops) * tokens / tp / (hw.peak_flops * mfu) * (4 / 3 if recompute else 1)

    def link(span):  # a group of consecutive ranks stays inside a node only if its span tiles the node
        return hw.intra_bandwidth if span <= hw.per_node and hw.per_node % span == 0 else hw.inter_bandwidth

    def all_reduce(size, n, bandwidth):
        return 0.0 if n == 1 else 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * hw.latency

    layers = max(end - first for first, end in stage_layers(gpt_config.n_layer, pp))
    activation = micro_batch_rows * T * C * compute_bytes
    loss_sums = 3 * all_reduce(micro_batch_rows * T * 4, tp, link(tp))  # the vocab-parallel loss
    tp_seconds = m * (((4 + recompute) * layers + 2) * all_reduce(activation, tp, link(tp)) + loss_sums)
    pp_seconds = 0.0 if pp == 1 else 2 * m * (activation / link(tp * pp) + hw.latency)
    bubble = (pp - 1) * (compute + tp_seconds + pp_seconds) / m
    gradients = 4 * fullest_rank_parameters(gpt_config, layout)
    dp_full = all_reduce(gradients, dp, link(dp * tp * pp))
    last_bucket = min(1.0, 25 * 2**20 / gradients)
    reduced = dp_full / 2 if zero else dp_full  # ZeRO: the reduce-scatter half; its all-gather comes after
    exposed = reduced if pp > 1 else max(reduced - 2 / 3 * compute / m, reduced * last_bucket)
    dp_seconds = exposed * (m if zero == 2 else 1) + dp_full - reduced  # ZeRO-2 reduces every micro-batch
    parts = {"compute": compute, "bubble": bubble, "tp": tp_seconds, "pp": pp_seconds, "dp": dp_seconds}
    step = sum(parts.values())
    in_flight = min(pp, m)  # 1F1B's first stage
    memory = memory_per_gpu(gpt_config, layout, micro_batch_rows, in_flight, compute_bytes).total
    achieved = flops_per_token(gpt_config) * batch_rows * T / (dp * tp * pp) / step / hw.peak_flops
    return Plan(layout, m, memory <= hw.memory, memory / 1e9, step, batch_rows * T / step, achieved, parts)


def layouts(gpt_config, gpus, batch_rows, micro_batch_rows):
    """Every Layout of dp x tp x pp = gpus that the model and the batch allow: tp divides the
    heads, every stage gets a block, every dp rank gets whole micro-batches."""
    found = []
    for tp in range(1, gpus + 1):
        for pp in range(1, gpus // tp + 1):
            dp = gpus // (tp * pp)
            if (
                dp * tp * pp == gpus
                and gpt_config.n_head % tp == 0
                and pp <= gpt_config.n_layer
                and batch_rows % (dp * micro_batch_rows) == 0
            ):
                found.append(Layout(dp=dp, tp=tp, pp=pp))
    return found


def long_context_rows(gpt_config, ways, lengths, micro_batch_rows=1, activation_bytes=2):
    """Cutting one sequence's work `ways` ways, at each context length T: per rank, the activations one step keeps
    (no recomputation, one micro-batch of micro_batch_rows sequences) and the bytes it sends, under TP, TP with
    sequence parallelism, and context parallelism; and the training state each keeps (TP cuts the weights, CP
    keeps them whole). -> [{"T", "activations": {name: bytes}, "comm": {name: bytes}, "state": {name: bytes}}]"""
    cuts = {"tp": Layout(tp=ways), "tp+sp": Layout(tp=ways, sequence_parallel=True), "cp": Layout(cp=ways)}
    rows = []
    for T in lengths:
        shape = replace(gpt_config, block_size=T)
        row = {"T": T, "activations": {}, "comm": {}, "state": {}}
        for name, cut in cuts.items():
            memory = memory_per_gpu(shape, cut, micro_batch_rows, 1, activation_bytes)
            sent = comm_bytes_per_step(
                shape, cut, stage=0, batch_size=micro_batch_rows, accumulation=1, compute_bytes=activation_bytes
            )
            row["activations"][name], row["state"][name] = memory.activations, memory.state
            row["comm"][name] = sent["tp"][0] + sent["cp"][0]
        rows.append(row)
    return rows


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


def rank_layouts(gpt_config, hw, gpus, batch_rows, micro_batch_rows, mfu, recompute=False, zero=0):
    """All layouts, planned: the ones that fit first, fastest first."""
    plans = [
        plan_layout(gpt_config, hw, replace(layout, recompute=recompute, zero=zero), batch_rows, micro_batch_rows, mfu)
        for layout in layouts(gpt_config, gpus, batch_rows, micro_batch_rows)
    ]
    if not plans:
        raise ValueError(
            f"--gpus {gpus}: no layout dp x tp x pp = {gpus} suits this model and batch: tp must divide "
            f"n_head {gpt_config.n_head}, pp be at most n_layer {gpt_config.n_layer}, and dp x micro_batch_rows divide "
            f"the {batch_rows} sequences of a step. Choose --gpus as a product of such factors, "
            f"or change --batch_tokens / --micro_batch_rows"
        )
    return sorted(plans, key=lambda plan: (not plan.fits, plan.step_seconds))


def min_model_parallel(gpt_config, hw, most=4096):
    """The fewest devices (tp x pp, up to `most`) whose share of the 16 B/parameter state fits one device, or None."""
    for size in range(1, most + 1):
        if any(
            16 * fullest_rank_parameters(gpt_config, Layout(tp=tp, pp=size // tp)) <= hw.memory
            for tp in range(1, size + 1)
            if size % tp == 0 and gpt_config.n_head % tp == 0 and size // tp <= gpt_config.n_layer
        ):
            return size
    return None


# ----------------------------------------------------------------------------
# Checkpoints, against failures


@dataclass(frozen=True)
class CheckpointPlan:
    """When to checkpoint a run, and what its failures then cost (checkpoint_economics)."""

    checkpoint_gb: float  # fp32 weights and AdamW's two moments: 12 B per parameter
    save_seconds: float  # C: the time to write one checkpoint
    cluster_mtbf_hours: float  # one device's MTBF / the devices: the cluster stops when any one fails
    interval_minutes: float  # Young's sqrt(2 C MTBF)
    goodput_lost: float  # the share of the run's time lost when checkpointing at that interval


def share_of_time_lost(interval_seconds, save_seconds, cluster_mtbf_seconds, restart_seconds):
    """The share of a run's time lost checkpointing every interval_seconds: C / interval for saving,
    plus, per failure, half an interval of redone steps and the restart."""
    return save_seconds / interval_seconds + (interval_seconds / 2 + restart_seconds) / cluster_mtbf_seconds


def checkpoint_economics(params, gpus, write_bandwidth, gpu_mtbf_hours, restart_seconds):
    """When to checkpoint, as a CheckpointPlan. The cluster stops when any device fails: MTBF / gpus.
    A checkpoint (fp32 weights and AdamW's two moments: 12 B per parameter) takes C = size / write
    bandwidth. Young (1974): checkpoint every sqrt(2 C MTBF) (Daly 2006 refines it for intervals near
    the MTBF; this first-order rule holds while C << interval << MTBF)."""
    size = 12 * params
    save = size / write_bandwidth
    mtbf = gpu_mtbf_hours * 3600 / gpus
    interval = math.sqrt(2 * save * mtbf)
    return CheckpointPlan(
        checkpoint_gb=size / 1e9,
        save_seconds=save,
        cluster_mtbf_hours=mtbf / 3600,
        interval_minutes=interval / 60,
        goodput_lost=share_of_time_lost(interval, save, mtbf, restart_seconds),
    )


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


# ----------------------------------------------------------------------------
# The command line


def parse_count(text, flag):
    """'2T', '300B', '1.5M', '20k' or '1e9' -> a number."""
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    try:
        value = float(text[:-1]) * scale[text[-1].upper()] if text[-1].upper() in scale else float(text)
    except (ValueError, IndexError):
        raise ValueError(f"{flag} {text!r}: give a number, optionally with K, M, B or T (2T = 2e12)") from None
    if not 0 < value < math.inf:
        raise ValueError(f"{flag} {text}: must be positive and finite")
    return value


SHAPE = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
LLAMA_SHAPE = ("arch", "n_kv_head", "mlp_hidden", "tie_embeddings")  # what a Llama shape adds, as printed


def model_config(args):
    """(GPTConfig, tokens per step) of --model, with any shape flags applied over it, or of the shape flags."""
    if args.model is not None:
        if args.model not in MODELS:
            raise ValueError(
                f"--model {args.model!r}: choose one of {', '.join(MODELS)}, or give --n_layer --n_head "
                "--n_embd (--vocab_size --block_size) instead"
            )
        named = MODELS[args.model]
        return replace(
            named.gpt_config, **{k: v for k, v in vars(args).items() if k in SHAPE and v is not None}
        ), named.batch_tokens
    missing = [f"--{k}" for k in ("n_layer", "n_head", "n_embd") if getattr(args, k) is None]
    if missing:
        raise ValueError(f"give --model (one of {', '.join(MODELS)}) or the shape: {', '.join(missing)} missing")
    shape = {k: v for k, v in vars(args).items() if k in SHAPE and v is not None}
    return GPTConfig(**{"vocab_size": 50257, "block_size": 1024, **shape}), 2**19


def hardware(args, gpt_config, batch_rows):
    if args.gpu.lower() == "cpu":  # measured at one micro-batch (at most 4096 rows of the matmul)
        return measure_cpu(gpt_config, min(4096, args.micro_batch_rows * gpt_config.block_size), args.gpus)
    name = GPU_ALIASES.get(args.gpu, args.gpu)
    if name not in GPUS:
        raise ValueError(f"--gpu {args.gpu!r}: choose one of {', '.join([*GPUS, *GPU_ALIASES, 'cpu'])}")
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
        except ValueError as e:
            sys.exit(f"error: {e}")
        return print_long_context(gpt_config, args.model or "custom", args.long_context, args.micro_batch_rows)
    try:
        report = account(args)
    except ValueError as e:
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
            raise ValueError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    for flag in ("mfu", "usd_per_gpu_hour", "ckpt_write_gbps", "gpu_mtbf_hours"):
        if not getattr(args, flag) > 0:
            raise ValueError(f"--{flag} {getattr(args, flag)}: must be positive")
    if args.restart_minutes < 0:
        raise ValueError(f"--restart_minutes {args.restart_minutes}: must not be negative")
    if args.mfu > 1:
        raise ValueError(f"--mfu {args.mfu}: a share of the peak, at most 1")
    gpt_config, batch_tokens = model_config(args)
    N = parameters_on_rank(gpt_config)
    tokens = parse_count(args.tokens, "--tokens") if args.tokens else 20 * N
    batch_tokens = parse_count(args.batch_tokens, "--batch_tokens") if args.batch_tokens else batch_tokens
    if batch_tokens < gpt_config.block_size:
        raise ValueError(
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
