"""Watching a run: the cost account, throughput, the health detectors, the metrics plot.

The cost account includes, in closed form, the parameters each rank of a layout holds and
the bytes it sends per step in each parallel dimension (what parallel.counted counts), and
SavedActivations measures the activation memory a step keeps for backward.

A loss curve "talks": it starts at ln V (uniform guessing), falls fast, then
flattens. Trouble usually announces itself: the grad norm jumps, or the val
loss turns up while the train loss still falls, before the loss itself spikes.
HealthMonitor computes those leading indicators every step, and flags the
incidents that call for a rollback: a non-finite loss or grad norm, or a loss
spike above a robust baseline.
"""

import contextlib
import math
import statistics
import time
from collections import deque

import torch

from pipeline import stage_layers

# ----------------------------------------------------------------------------
# Cost account

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, matched against the device name.
GPU_PEAK_FLOPS = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 70e12, "A10": 125e12, "L40S": 362e12,
    "L4": 121e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12,
}


def device_peak_flops(device, peak_tflops=0.0):
    """FLOP/s the device could do at best, for MFU; None on CPU or an unknown GPU."""
    if peak_tflops > 0:
        return peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in name), None)


def cost_estimate(mc, num_params, flops_per_token, batch_size, max_iters, tokens_per_iter, activation_bytes,
                  step_seconds):
    """Lines of the run's cost account: compute, memory and time, before training starts.
    mc is the GPTConfig; num_params and flops_per_token count the whole single-device model,
    whatever share of it one rank holds."""
    N = num_params
    tokens = max_iters * tokens_per_iter
    flops = flops_per_token * tokens  # 6 N D + attention
    # Activations kept for backward per layer ~ B T C (34 + 5 H T / C) bytes at 16 bits
    # (Korthikanti et al. 2022, no recomputation), plus the logits and their fp32 copy.
    B, T, C, H, L, V = batch_size, mc.block_size, mc.n_embd, mc.n_head, mc.n_layer, mc.vocab_size
    activations = L * B * T * C * (34 + 5 * H * T / C) * activation_bytes / 2 + B * T * V * (activation_bytes + 4)
    minutes = step_seconds * max_iters / 60
    h100_hours = flops / (0.4 * GPU_PEAK_FLOPS["H100"]) / 3600
    gib = 2**30
    return [
        f"parameters: {N / 1e6:.2f}M; planned tokens: {tokens / 1e6:.1f}M ({tokens / N:.1f} per parameter)",
        f"training compute: {flops:.3g} FLOPs (6 N D = {6 * N * tokens:.3g}, plus attention)",
        f"memory of the whole model: weights {4 * N / gib:.3f} GiB + grads {4 * N / gib:.3f} + AdamW {8 * N / gib:.3f} "
        f"+ activations ~{activations / gib:.3f} per micro-batch",
        f"measured forward + backward: {step_seconds * 1e3:.0f} ms per step -> ~{minutes:.1f} min "
        f"for {max_iters} steps on this device",
        f"the same FLOPs on one H100 at 40% MFU: {h100_hours:.3g} GPU-hours (~${2 * h100_hours:.3g} at $2/GPU-hour)",
    ]


def parameters_on_rank(mc, tp, pp, stage):
    """Closed form of the parameters one rank holds (stage `stage` of pp, a 1/tp slice of its
    matrices): what its optimizer updates and its data-parallel all-reduce carries.

    A block's four matrices (q k v: 3 C^2, attention out: C^2, MLP: 4 C^2 + 4 C^2) are cut
    by tp, its norms stay whole on every TP rank. The first stage adds the embedding (its
    V/tp rows, the vocabulary padded to a multiple of tp) and the positions; the last stage
    the final norm and, when it is not also the first, its own copy of the tied embedding."""
    C, V = mc.n_embd, mc.vocab_size
    norm = C * (2 if mc.norm == "layernorm" and mc.bias else 1)
    block = 12 * C * C // tp + 2 * norm + ((7 * C) // tp + 2 * C if mc.bias else 0)  # column biases cut, row biases whole
    first_block, end_block = stage_layers(mc.n_layer, pp)[stage]
    embedding = -(-V // tp) * C
    n = (end_block - first_block) * block
    if stage == 0:
        n += embedding + mc.block_size * C
    if stage == pp - 1:
        n += (norm if mc.norm_position == "pre" else 0) + (embedding if pp > 1 else 0)
    return n


def comm_bytes_per_step(mc, *, dp, tp, pp, stage, batch_size, accumulation, compute_bytes):
    """Closed form of the bytes a rank of pipeline stage `stage` hands to each dimension's
    communication in one optimizer step (what parallel.counted counts), with
    the step's explanation: {dimension: (bytes, formula)}.

    B = batch_size rows per micro-step (all of a pipeline's micro-batches together), A
    micro-steps of accumulation, T = block_size, C = n_embd, L = the stage's blocks. The
    activations cross in fp32, except the row-parallel matmul outputs, which are in the
    compute dtype (compute_bytes: 2 under bf16 or fp16 autocast).
      tp: per block, 2 all-reduces forward (after attention and after the MLP) and 2 backward
          (before them), every micro-step: at every layer. Plus the embedding's forward on
          the first stage, the head's backward and the loss's 3 (B, T) reductions (a max,
          two sums) on the last.
      pp: per micro-step, the activation (B, T, C) to the next stage and its gradient back to
          the one before: between stages only. Plus, once per step, the tied embedding's
          gradient between the first and last stages.
      dp: once per step, the gradient of every parameter the rank holds, fp32.
    """
    B, T, C, A = batch_size, mc.block_size, mc.n_embd, accumulation
    first_block, end_block = stage_layers(mc.n_layer, pp)[stage]
    L, first, last = end_block - first_block, stage == 0, stage == pp - 1
    act = B * T * C  # elements of one (B, T, C) activation
    tp_bytes = pp_bytes = dp_bytes = 0
    tp_how = pp_how = dp_how = "none: a group of 1"
    if tp > 1:
        per_micro_step = 2 * L * act * (compute_bytes + 4) + first * act * 4 + last * (act * 4 + 3 * B * T * 4)
        tp_bytes = A * per_micro_step
        tp_how = (f"A x [2 L B T C x ({compute_bytes} + 4) at every layer"
                  + (" + B T C x 4 (embedding)" if first else "")
                  + (" + B T C x 4 (head) + 3 B T x 4 (loss)" if last else "")
                  + f"], A={A} L={L} B={B} T={T} C={C}")
    if pp > 1:
        neighbours = (not first) + (not last)
        tied = (first or last) * -(-mc.vocab_size // tp) * C * 4
        pp_bytes = A * neighbours * act * 4 + tied
        sent = "activations forward and gradients back" if neighbours == 2 else \
            "activations to the next stage" if first else "gradients to the stage before"
        pp_how = (f"A x {neighbours} x B T C x 4 ({sent})"
                  + (f" + V/tp x C x 4 (tied embedding's gradient), V={mc.vocab_size}" if tied else "")
                  + f", A={A} B={B} T={T} C={C}")
    if dp > 1:
        held = parameters_on_rank(mc, tp, pp, stage)
        dp_bytes = 4 * held
        dp_how = f"4 x {held:,} parameters on the rank, once per step"
    return {"dp": (dp_bytes, dp_how), "tp": (tp_bytes, tp_how), "pp": (pp_bytes, pp_how)}


class SavedActivations:
    """Measures the peak bytes autograd keeps for backward while the context is open: a step's
    activation memory, on any device (torch.cuda's allocator statistics exist on GPUs only).

        with SavedActivations(module) as saved:
            loss.backward() ...
        saved.peak  # bytes

    A saved tensor counts from its forward until the backward that frees its graph node;
    storages that several saved tensors share count once; the module's parameters, which
    backward keeps too, do not count. A pipeline stage under 1F1B keeps at most p
    micro-batches' worth at once, under GPipe all m: this is where that shows in bytes."""

    def __init__(self, module):
        self.parameters = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.live = {}  # storage address -> [bytes, saved tensors that use it]
        self.now = self.peak = 0

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address in self.parameters:
            return tensor
        if address not in self.live:
            self.live[address] = [storage.nbytes(), 0]
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        self.live[address][1] += 1
        return _Saved(tensor.detach(), self, address)  # detached: no cycle through its grad_fn, which would outlive a dropped graph

    def _release(self, address):
        entry = self.live[address]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[address]

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda saved: getattr(saved, "tensor", saved))
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


class _Saved:
    """A tensor autograd saved, which tells its SavedActivations when the graph lets it go."""

    def __init__(self, tensor, meter, address):
        self.tensor, self.meter, self.address = tensor, meter, address

    def __del__(self):
        self.meter._release(self.address)


class Throughput:
    """Tokens per second over the steps since the last reading, evaluation time left out."""

    def __init__(self, tokens_per_step):
        self.tokens_per_step = tokens_per_step
        self._restart()

    def _restart(self):
        self.start, self.steps, self.paused_seconds = time.perf_counter(), 0, 0.0

    @contextlib.contextmanager
    def paused(self):
        t0 = time.perf_counter()
        yield
        self.paused_seconds += time.perf_counter() - t0

    def step_done(self):
        self.steps += 1

    def read(self):
        """(tokens/s, seconds per step) since the last reading; starts the next interval."""
        elapsed = time.perf_counter() - self.start - self.paused_seconds
        tokens_per_s = self.steps * self.tokens_per_step / max(elapsed, 1e-9)
        seconds_per_step = elapsed / max(self.steps, 1)
        self._restart()
        return tokens_per_s, seconds_per_step


# ----------------------------------------------------------------------------
# Health: leading indicators and incident detectors


class HealthMonitor:
    """Per-step checks against rolling baselines of the last `window` healthy steps.

    - nonfinite: loss or grad norm is NaN or inf. Always an incident.
    - spike: loss > spike_factor x median of recent losses (the median ignores
      the odd noisy step that a mean would follow).
    - grad_z: (grad norm - mean) / std of recent grad norms: a leading indicator.
    - val_rise: the val loss rose for val_rise_evals evals in a row while the
      train loss fell: the other leading indicator.
    Detectors named in `triggers` are incidents (roll back); the others only
    warn, and a warning makes the next checkpoint "unhealthy", so a rollback
    will not choose it.
    """

    DETECTORS = ("nonfinite", "spike", "grad_z", "val_rise")

    def __init__(self, window, spike_factor, grad_z_threshold, val_rise_evals, triggers):
        unknown = set(triggers) - set(self.DETECTORS)
        if unknown:
            raise ValueError(f"--triggers {','.join(sorted(unknown))}: choose from {','.join(self.DETECTORS)}")
        self.window, self.spike_factor = window, spike_factor
        self.grad_z_threshold, self.val_rise_evals = grad_z_threshold, val_rise_evals
        self.triggers = set(triggers) | {"nonfinite"}
        self.losses, self.grad_norms = deque(maxlen=window), deque(maxlen=window)
        self.evals = []  # (val loss, median train loss at that time)
        self.warned = False  # a leading indicator fired since the last checkpoint

    def baseline_ready(self):
        return len(self.losses) >= max(2, self.window // 2)

    def check_step(self, loss, grad_norm):
        """-> (grad-norm z-score, list of (detector, values) that fired)."""
        fired = []
        z = 0.0
        if self.baseline_ready():
            mean, std = statistics.fmean(self.grad_norms), statistics.pstdev(self.grad_norms)
            z = (grad_norm - mean) / max(std, 1e-8) if math.isfinite(grad_norm) else math.inf
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            fired.append(("nonfinite", {"loss": str(loss), "grad_norm": str(grad_norm)}))  # JSON has no NaN
        elif self.baseline_ready() and loss > self.spike_factor * statistics.median(self.losses):
            fired.append(("spike", {"loss": loss, "baseline": statistics.median(self.losses), "factor": self.spike_factor}))
        if self.grad_z_threshold and z > self.grad_z_threshold:
            fired.append(("grad_z", {"grad_norm": grad_norm, "z": z, "threshold": self.grad_z_threshold}))
        if not fired:  # only healthy steps feed the baselines
            self.losses.append(loss)
            self.grad_norms.append(grad_norm)
        return z, self._sort(fired)

    def check_eval(self, val_loss):
        """-> list of (detector, values) that fired: val_rise or nothing."""
        train = statistics.median(self.losses) if self.losses else math.inf
        self.evals.append((val_loss, train))
        k = self.val_rise_evals
        recent = self.evals[-(k + 1) :]
        if k and len(recent) == k + 1:
            val_up = all(b[0] > a[0] for a, b in zip(recent, recent[1:]))
            train_down = all(b[1] < a[1] for a, b in zip(recent, recent[1:]))
            if val_up and train_down:
                return self._sort([("val_rise", {"val_losses": [v for v, _ in recent], "evals": k})])
        return []

    def _sort(self, fired):
        """Incidents first; warnings mark the interval unhealthy."""
        if any(name not in self.triggers for name, _ in fired):
            self.warned = True
        return sorted(fired, key=lambda item: item[0] not in self.triggers)

    def is_incident(self, fired):
        return bool(fired) and fired[0][0] in self.triggers

    def take_healthy_mark(self):
        """True if nothing fired since the last call: the mark for the checkpoint being saved."""
        healthy, self.warned = not self.warned, False
        return healthy

    def state_dict(self):
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms), "evals": list(self.evals),
                "warned": self.warned}

    def load_state_dict(self, state):
        self.losses = deque(state["losses"], maxlen=self.window)
        self.grad_norms = deque(state["grad_norms"], maxlen=self.window)
        self.evals = [tuple(e) for e in state["evals"]]
        self.warned = state["warned"]


def layer_grad_norms(module):
    """[L2 norm of block i's gradient for each transformer block] of a single-device GPT, after
    backward: how the gradient is spread over depth, which is where Pre-LN and Post-LN differ
    (Xiong et al. 2020; notebooks/02_four_defenses.ipynb measures it)."""
    squares = [torch.zeros(()) for _ in module.blocks]
    for name, p in module.named_parameters():
        if name.startswith("blocks.") and p.grad is not None:
            squares[int(name.split(".")[1])] += p.grad.detach().float().pow(2).sum().cpu()
    return [s.sqrt().item() for s in squares]


# ----------------------------------------------------------------------------
# The picture of a run


def plot_metrics(records, incidents, path, ln_vocab):
    """loss and val loss against ln V, grad norm, LR; a red line at each incident."""
    from matplotlib.figure import Figure  # no pyplot: drawing to a file leaves a notebook's plotting alone

    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    train = [r for r in records if "loss" in r]  # the final record holds only the val loss
    steps = [r["step"] for r in train]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    axes[0].plot(steps, [r["loss"] for r in train], label="train loss")
    if val:
        axes[0].plot(*zip(*val), "o-", label="val loss")
    axes[0].axhline(ln_vocab, color="gray", ls="--", label="ln V (uniform guess)")
    for i, incident in enumerate(incidents):
        axes[0].axvline(incident["step"], color="red", alpha=0.6, label="incident" if i == 0 else None)
        axes[0].annotate(incident["detector"], (incident["step"], ln_vocab), color="red", rotation=90, va="top")
    axes[0].set(xlabel="step", ylabel="loss", title="loss")
    axes[0].legend()
    axes[1].plot(steps, [r["grad_norm"] for r in train])
    axes[1].set(xlabel="step", yscale="log", title="grad norm (before clipping)")
    axes[2].plot(steps, [r["lr"] for r in train])
    axes[2].set(xlabel="step", title="learning rate")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
