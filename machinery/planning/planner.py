"""The layout planner: a run's step time and memory on each way to cut it across a cluster's devices (dp x tp x pp),
ranked, from the closed forms (closed_forms.py) and the hardware's peaks and links; and when to checkpoint it,
given how often a device fails (Young/Daly). `python -m machinery.cost` prints its account.
"""

import math
import os
import time
from dataclasses import dataclass, replace

import torch

from errors import UserError
from machinery.planning.closed_forms import (
    comm_bytes_per_step,
    flops_per_token,
    fullest_rank_parameters,
    memory_per_gpu,
)
from parallel.grid import Layout
from parallel.pipeline import stage_layers

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
    from machinery.job.local_ranks import results_of, run_ranks

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
# A layout's step time and memory, and the layouts ranked


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


def rank_layouts(gpt_config, hw, gpus, batch_rows, micro_batch_rows, mfu, recompute=False, zero=0):
    """All layouts, planned: the ones that fit first, fastest first."""
    plans = [
        plan_layout(gpt_config, hw, replace(layout, recompute=recompute, zero=zero), batch_rows, micro_batch_rows, mfu)
        for layout in layouts(gpt_config, gpus, batch_rows, micro_batch_rows)
    ]
    if not plans:
        raise UserError(
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
