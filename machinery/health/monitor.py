"""Meters of a run: the activation memory a step keeps, the state's bytes, throughput, the per-layer grad norms,
and the pictures (the metrics plot, a schedule's Gantt chart). What the run will cost, in closed form, is
closed_forms.py's; the health detectors are incidents.py's.
"""

import contextlib
import sys
import time
from collections import Counter

import torch

# ----------------------------------------------------------------------------
# Memory a step keeps


class SavedActivations:
    """Measures the peak bytes autograd keeps for backward while the context is open: a step's
    activation memory, on any device (torch.cuda's allocator statistics exist on GPUs only).

        with SavedActivations(module) as saved:
            loss.backward() ...
        saved.peak  # bytes
        saved.by_kind  # bytes of every storage saved while open, by kind: {"float32": ..., "bfloat16": ...}

    A saved tensor counts from its forward until the backward that frees its graph node;
    storages that several saved tensors share count once; the module's parameters, which
    backward keeps too, do not count. A pipeline stage under 1F1B keeps at most p
    micro-batches' worth at once, under GPipe all m: this is where that shows in bytes.
    kind(tensor) -> str names what a saved tensor is (its dtype unless told), e.g. to tell
    autocast's 16-bit copies of the weights from 16-bit activations."""

    def __init__(self, module, kind=lambda tensor: str(tensor.dtype).removeprefix("torch.")):
        # a DTensor (--dp_mode fsdp) by its local shard
        self.parameters = {getattr(p, "_local_tensor", p).untyped_storage().data_ptr() for p in module.parameters()}
        self.live = {}  # storage address -> [bytes, saved tensors that use it]
        self.now = self.peak = 0
        self.kind, self.by_kind = kind, Counter()

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address in self.parameters:
            return tensor
        if address not in self.live:
            self.live[address] = [storage.nbytes(), 0]
            self.now += storage.nbytes()
            self.by_kind[self.kind(tensor)] += storage.nbytes()
            self.peak = max(self.peak, self.now)
        self.live[address][1] += 1
        return _Saved(
            tensor.detach(), self, address
        )  # detached: no cycle through its grad_fn, which would outlive a dropped graph

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


def state_bytes(module, optimizer):
    """The bytes of training state this rank holds now: the module's weights and their gradients, the
    optimizer's parameters and their gradients (under ZeRO, pieces of the weights' flat buffers and of the
    gradients' shards) and its state (AdamW's moments), each storage once: views into one buffer count once,
    with its padding. AdamW's step counters, scalars, do not count. Taken at an update, when it all exists."""
    tensors = [t for p in module.parameters() for t in (p, p.grad)]
    for group in optimizer.param_groups:
        for p in group["params"]:
            tensors += [p, p.grad, *optimizer.state.get(p, {}).values()]
    storages = {}
    for t in tensors:
        if torch.is_tensor(t) and t.dim() > 0:
            t = getattr(t, "_local_tensor", t)  # a DTensor (--dp_mode fsdp): this rank's shard
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def peak_memory_bytes(device):
    """The most memory this process has held so far: the CUDA allocator's peak on a GPU, else the
    process's peak resident set (weights, AdamW state, activations, the token files' pages read);
    None where neither is known."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    if sys.platform == "win32":
        return None
    import resource  # Unix only

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


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
    axes = fig.subplots(1, 3, gridspec_kw=dict(left=0.04, right=0.99, bottom=0.13, top=0.92, wspace=0.18))
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
    fig.savefig(path, dpi=100)  # fixed margins: tight_layout would take half of the time


def plot_gantt(timeline, path, title):
    """One row per stage: forwards and backwards in two colours, waits hatched, idle blank."""
    from matplotlib.figure import Figure  # no pyplot: drawing to a file leaves a notebook's plotting alone
    from matplotlib.patches import Patch

    t0 = min(slot.start for stage in timeline for slot in stage)
    colours = {"F": "tab:blue", "B": "tab:orange", "wait": "lightgray"}
    fig = Figure(figsize=(12, 0.6 * len(timeline) + 1.5))
    ax = fig.subplots()
    for s, stage in enumerate(timeline):
        for kind, i, start, end, k in stage:
            ax.broken_barh(
                [(1e3 * (start - t0), 1e3 * (end - start))],
                (s - 0.4, 0.8),
                color=colours[kind],
                alpha=1.0 / (1 + k),  # a rank's later chunks (interleaved) paler
                hatch="//" if kind == "wait" else None,
                edgecolor="white" if kind != "wait" else "gray",
            )
            if kind != "wait" and end - start > 0:
                label = f"{i}" if k == 0 else f"{i}.{k}"  # micro-batch, and the rank's chunk past the first
                ax.text(
                    1e3 * ((start + end) / 2 - t0),
                    s,
                    label,
                    ha="center",
                    va="center",
                    fontsize=9,
                    color="white" if k == 0 else "black",
                )
    ax.set(
        yticks=range(len(timeline)), yticklabels=[f"rank {s}" for s in range(len(timeline))], xlabel="ms", title=title
    )
    ax.invert_yaxis()
    handles = [
        Patch(
            facecolor=c,
            hatch="//" if k == "wait" else None,
            edgecolor="gray" if k == "wait" else "white",
            label={"F": "forward", "B": "backward", "wait": "waiting"}[k],
        )
        for k, c in colours.items()
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)  # beside the chart, over no box
    fig.tight_layout()
    fig.savefig(path, dpi=150)  # a notebook shows it: 150 dpi, as lab.py draws
