"""Pipeline parallelism: GPipe and 1F1B schedules over model stages, with a measured, drawn bubble.

Consecutive blocks live on consecutive ranks (stages); activations flow forward
stage to stage and their gradients flow back. A stage must wait for the one
before it, so the pipeline fills and drains: the bubble. Cutting the batch
into m micro-batches shrinks it: with p stages, GPipe idles for a fraction

    (p - 1) / (m + p - 1)

of the time (Huang et al. 2019). 1F1B (PipeDream-Flush, Narayanan et al. 2021)
has the same bubble but interleaves forwards and backwards, so a stage keeps at
most p micro-batches of activations instead of m.

Interleaved 1F1B (--virtual_stages v, Narayanan et al. 2021, section 2.2) cuts the
layers into p v chunks and gives rank r chunks r, r + p, r + 2p, ...: a micro-batch
goes around the ranks v times. Each operation is then 1/v of a stage's work, and the
pipeline fills and drains in chunks, so the bubble shrinks v-fold:

    (p - 1) / (v m + p - 1)

paid for with v times the point-to-point sends (2 v a micro-batch on the ranks between, 2 v - 1 on the ends).

A schedule here is a plain function that lists one rank's operations in order,
("F", i) or ("B", i) for micro-batch i, or ("F", i, k) and ("B", i, k) on its model
chunk k when interleaved; `run_schedule` executes such a list with point-to-point
sends and receives, and records when each rank computes and waits.

    python -m parallel.pipeline --stages 4 --micro_batches 8   # runs nothing distributed: prints the logical bubbles
"""

import argparse
import contextlib
import functools
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn

from model import run_blocks
from parallel.comm_count import counted
from parallel.context_parallel import cut_sequences, mean_over_cp
from parallel.data_parallel import clear_gradients
from parallel.optimizer import sharded_grad_norm

# ----------------------------------------------------------------------------
# Schedules: the order of one stage's operations


class Slot(NamedTuple):
    """One entry of a rank's timeline: a forward ("F") or backward ("B") of a micro-batch, or
    waiting ("wait") for its input from a neighbour rank."""

    kind: str
    micro_batch: int
    start: float  # seconds, or time slots in a logical timeline
    end: float
    chunk: int = 0  # which of the rank's model chunks (interleaved 1F1B); 0 otherwise


def operation(op):
    """(kind, micro-batch, the rank's chunk) of a schedule's entry: ("F", i) runs chunk 0, ("F", i, k) chunk k."""
    kind, i, *chunk = op
    return kind, i, chunk[0] if chunk else 0


def gpipe(stages, micro_batches, stage):
    """All forwards, then all backwards."""
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]


def one_f_one_b(stages, micro_batches, stage):
    """Warmup forwards, then one forward and one backward in turn, then the remaining backwards."""
    # exercise one_f_one_b: begin
    warmup = min(stages - stage - 1, micro_batches)  # forwards in flight before the first backward returns
    order = [("F", i) for i in range(warmup)]  # warmup
    for i in range(micro_batches - warmup):  # steady state: 1 forward, 1 backward
        order += [("F", warmup + i), ("B", i)]
    order += [("B", i) for i in range(micro_batches - warmup, micro_batches)]  # cooldown
    return order
    # exercise one_f_one_b: end


def interleaved_1f1b(stages, micro_batches, stage, chunks):
    """1F1B over the rank's `chunks` model chunks (Megatron-LM's interleaved schedule). The rank's m v forwards
    go in groups of p micro-batches, chunk by chunk: micro-batches 0..p-1 through chunk 0, then through chunk 1,
    ..., then micro-batches p..2p-1 through chunk 0, and so on (m a multiple of p); its backwards in the same
    order, last chunk first. Warmup runs enough forwards that the first backward's gradient is on its way when
    they end: 2 (p - s - 1) for the ranks after this one to fill, and (v - 1) p for its own later chunks."""
    total = micro_batches * chunks

    def virtual(j, backward):  # the rank's j-th forward (or backward) -> (micro-batch, chunk)
        chunk = (j // stages) % chunks
        return (j // (stages * chunks)) * stages + j % stages, chunks - 1 - chunk if backward else chunk

    if micro_batches == stages:  # a single group: every forward first, as later chunks wait on earlier ones
        warmup = total
    else:
        warmup = min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)
    order = [("F", *virtual(j, False)) for j in range(warmup)]
    for j in range(total - warmup):  # steady state: 1 forward, 1 backward
        order += [("F", *virtual(warmup + j, False)), ("B", *virtual(j, True))]
    order += [("B", *virtual(j, True)) for j in range(total - warmup, total)]  # cooldown
    return order


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def schedule_for(name, chunks=1):
    """The schedule function (stages, micro_batches, stage) -> one rank's operations: SCHEDULES[name], or
    interleaved 1F1B over `chunks` chunks a rank."""
    if chunks > 1 and name != "1f1b":
        raise ValueError(f"schedule {name!r} is not interleaved: {chunks} chunks a rank take 1f1b")
    return SCHEDULES[name] if chunks == 1 else functools.partial(interleaved_1f1b, chunks=chunks)


def logical_timeline(schedule, stages, micro_batches):
    """Play a schedule with every operation taking one time slot. Chunk k of stage s is the model's stage
    g = k p + s (of p v): F of micro-batch i on g waits for F i on g - 1; B i on g waits for B i on g + 1 (and
    F i on g). Returns, per rank, its list of Slots; a schedule that cannot go on is an error naming it."""
    orders = [[operation(op) for op in schedule(stages, micro_batches, s)] for s in range(stages)]
    last = stages * (1 + max(k for order in orders for _, _, k in order)) - 1  # the model's last stage
    done, position, free_at = {}, [0] * stages, [0] * stages
    slots = [[] for _ in range(stages)]
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, i, k = orders[s][position[s]]
            g = k * stages + s
            needs = [("F", i, g - 1)] if kind == "F" and g > 0 else []
            needs += [("B", i, g + 1)] if kind == "B" and g < last else []
            needs += [("F", i, g)] if kind == "B" else []
            if all(n in done for n in needs):
                start = max([free_at[s]] + [done[n] for n in needs])
                done[(kind, i, g)] = free_at[s] = start + 1
                slots[s].append(Slot(kind, i, start, start + 1, k))
                position[s] += 1
                progressed = True
        if not progressed:
            name = getattr(schedule, "__name__", None) or schedule.func.__name__
            raise RuntimeError(f"{name} deadlocks with {stages} stages and {micro_batches} micro-batches")
    return slots


def check_schedule(schedule, stages, micro_batches, chunks=1):
    """A schedule runs: on every rank, each micro-batch's forward and backward through each of its chunks exactly
    once; (logical_timeline) every operation's input made before it, so no rank waits forever; and on every link
    between two ranks, each kind of message received in the order it is sent, as run_schedule's receives (posted
    in the receiver's order, matched in the sender's) need."""
    every = sorted((kind, i, k) for kind in "FB" for i in range(micro_batches) for k in range(chunks))
    orders = [[operation(op) for op in schedule(stages, micro_batches, s)] for s in range(stages)]
    for s, order in enumerate(orders):
        if sorted(order) != every:
            raise ValueError(
                f"the schedule of rank {s} of {stages} does not run F and B of each of {micro_batches} micro-batches "
                f"through each of its {chunks} chunks once: {order}"
            )
    logical_timeline(schedule, stages, micro_batches)
    last = stages * chunks - 1
    sent, received = {}, {}  # (kind, from rank, to rank) -> [(micro-batch, model stage it feeds)] in order
    for s, order in enumerate(orders):
        for kind, i, k in order:
            g = k * stages + s
            if (kind == "F" and g < last) or (kind == "B" and g > 0):  # its output goes on to the next stage
                to = g + 1 if kind == "F" else g - 1
                sent.setdefault((kind, s, to % stages), []).append((i, to))
            if (kind == "F" and g > 0) or (kind == "B" and g < last):  # its input comes from a neighbour
                source = g - 1 if kind == "F" else g + 1
                received.setdefault((kind, source % stages, s), []).append((i, g))
    for link, messages in received.items():
        if sent.get(link) != messages:
            kind, source, to = link
            raise ValueError(
                f"rank {to} receives its {kind} messages from rank {source} in another order than they are sent: "
                f"{messages} against {sent.get(link)}"
            )


def bubble_fraction(timeline):
    """Idle share of stages x span, from each stage's list of Slots; only forwards ("F") and
    backwards ("B") count as work."""
    work = [[slot for slot in stage if slot.kind in ("F", "B")] for stage in timeline]
    start = min(slot.start for stage in work for slot in stage)
    end = max(slot.end for stage in work for slot in stage)
    busy = sum(slot.end - slot.start for stage in work for slot in stage)
    return 1 - busy / (len(timeline) * (end - start))


def peak_activations(order):
    """Most micro-batches' activations (of one chunk each, when interleaved) a rank holds at once under this order."""
    held = peak = 0
    for kind, *_ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


# ----------------------------------------------------------------------------
# A stage of the model


def stage_layers(n_layer, stages):
    """Which consecutive blocks each pipeline stage holds, balanced: [first, last) block indices of each stage.
    Arithmetic on n_layer alone: the stages are built by it, and closed_forms.py counts them without a process."""
    bounds, first = [], 0
    for s in range(stages):
        count = n_layer // stages + (s < n_layer % stages)  # the first n_layer % stages stages take one block more
        bounds.append((first, first + count))
        first += count
    return bounds


class PipelineStage(nn.Module):
    """One stage's part of a GPT (whole, or already cut for tensor parallelism): its blocks;
    the embeddings on the first stage; the final norm, the head and the loss on the last.
    With tied embeddings the first and last stages each hold a copy of the (V, C) matrix
    (of its TP slice); their gradients are summed between them after backward
    (`sync_tied_embedding`), so both copies take the same step.

    Memory per rank: about 1/(p tp) of the blocks' parameters, plus the embedding's 1/tp on the ends.
    """

    def __init__(self, model, stage, stages, sequence_shards=1):
        super().__init__()
        self.stage, self.stages, self.recompute = stage, stages, model.recompute
        self.sequence_shards = sequence_shards  # --sequence_parallel: a stage's activations hold T/tp positions
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.first_block, last_block = stage_layers(model.config.n_layer, stages)[stage]
        self.blocks = nn.ModuleList(model.blocks[self.first_block : last_block])
        self.tied = model.config.tie_embeddings
        embedding = {"wte": model.wte, "drop": model.drop} | ({"wpe": model.wpe} if model.wpe is not None else {})
        self.embedding = nn.ModuleDict(embedding) if self.is_first else None  # no wpe: rotary positions (llama)
        if self.is_last:
            # The head is tied to wte (under TP: to wte's vocabulary slice, scored by a vocab-parallel loss), or
            # (--tie_embeddings false) a matrix of its own that lives on this stage alone.
            self.norm_f, self.lm_head, self.clm_loss = model.norm_f, model.lm_head, model.clm_loss
            if self.tied and not self.is_first:  # a separate last stage holds its own copy of the matrix
                self.lm_head.weight = nn.Parameter(self.lm_head.weight.detach().clone())

    def forward(self, x, targets=None):
        """First stage: x is token ids (B, T); otherwise the activation (B, T, C) from the stage
        before. Last stage: returns the loss; otherwise the activation (B, T, C) for the next."""
        if self.is_first:
            tokens = self.embedding["wte"](x)
            if "wpe" in self.embedding:
                tokens = tokens + self.embedding["wpe"](torch.arange(x.shape[1], device=x.device))
            x = self.embedding["drop"](tokens)
        x = run_blocks(self.blocks, x, self.recompute)
        if not self.is_last:
            return x
        return self.clm_loss(self.lm_head(self.norm_f(x)), targets)

    def global_names(self):
        """{this stage's parameter name: the single-device model's name}."""
        names = {}
        for name, _ in self.named_parameters():
            if name.startswith("blocks."):
                _, index, rest = name.split(".", 2)
                names[name] = f"blocks.{self.first_block + int(index)}.{rest}"
            elif name.startswith("embedding."):
                names[name] = name.removeprefix("embedding.")
            else:  # the head's copy of the tied matrix is the single-device model's wte
                names[name] = "wte.weight" if name == "lm_head.weight" and self.tied else name
        return names

    def tied_embedding(self):
        """The tied (V, C) matrix this stage holds, if any: wte on the first, the head on the last."""
        if not self.tied:
            return None
        if self.is_first:
            return self.embedding["wte"].weight
        return self.lm_head.weight if self.is_last else None

    def tied_copy(self):
        """The last stage's copy of the tied matrix (None on the first stage, which holds the
        original): the grad norm counts the matrix once, on the first stage."""
        return self.lm_head.weight if self.tied and self.is_last and not self.is_first else None


class PipelineRank(nn.Module):
    """The stages a pipeline rank holds, its chunks: stage `rank` of `ranks` (one chunk), or under interleaving
    (`chunks` = v > 1) stages rank, rank + p, ..., rank + (v - 1) p of the model cut into p v stages."""

    def __init__(self, model, rank, ranks, chunks=1, sequence_shards=1):
        super().__init__()
        stages = ranks * chunks
        self.chunks = nn.ModuleList(
            PipelineStage(model, k * ranks + rank, stages, sequence_shards) for k in range(chunks)
        )

    def global_names(self):
        """{this rank's parameter name: the single-device model's name}."""
        return {
            f"chunks.{k}.{name}": whole
            for k, chunk in enumerate(self.chunks)
            for name, whole in chunk.global_names().items()
        }

    def tied_embedding(self):
        """The tied (V, C) matrix this rank holds, if any: wte on the first rank, the head on the last."""
        return next((w for w in (chunk.tied_embedding() for chunk in self.chunks) if w is not None), None)

    def tied_copy(self):
        """The last rank's copy of the tied matrix, counted once in the grad norm (the first rank's)."""
        return next((w for w in (chunk.tied_copy() for chunk in self.chunks) if w is not None), None)


def sync_tied_embedding(stage, grid):
    """Sum the tied matrix's gradient between the first and last ranks (its two copies):
    together they hold the gradient of the one matrix of the single-device model."""
    weight = stage.tied_embedding()
    if grid.pp > 1 and weight is not None and weight.grad is not None:
        dist.all_reduce(counted("pp", weight.grad), group=grid.embedding_group)


# ----------------------------------------------------------------------------
# Running a schedule: point-to-point communication, timed


def ring_neighbours(grid):
    """(previous, next) pipeline rank around the ring: interleaving sends the last rank's chunk k on to the
    first rank's chunk k + 1 (and its gradient back); without it the ends never use the wrap."""
    index, ranks = grid.pp_rank, grid.pp_ranks
    return ranks[(index - 1) % len(ranks)], ranks[(index + 1) % len(ranks)]


class Inbox:
    """One schedule's receives, each posted one operation ahead: while a rank computes, the
    input of its next operation that needs one (an activation from the previous stage for a
    forward, a gradient from the next stage for a backward) is already arriving. A receive
    posted only when the rank reaches the operation waits for the transfer on top of any real
    dependency, and that wait would add to the bubble.

    The buffers are allocated once per schedule, one (receives, B/m, T, C) block per direction,
    and nothing but the payload travels: both ends know the shape. Messages of one kind from one
    neighbour arrive in the order it sent them, which the receives follow."""

    def __init__(self, rank, order, shape, grid, device):
        receives = {
            "F": lambda k: not rank.chunks[k].is_first,  # a forward's input comes from the stage before...
            "B": lambda k: not rank.chunks[k].is_last,  # ... a backward's gradient from the one after
        }
        self.waiting = {
            kind: [(i, k) for op_kind, i, k in order if op_kind == kind and needs(k)]
            for kind, needs in receives.items()
        }
        self.source, self.groups = dict(zip("FB", ring_neighbours(grid))), grid.pp_message_groups
        blocks = {kind: torch.empty((len(waiting), *shape), device=device) for kind, waiting in self.waiting.items()}
        self.buffers = {kind: dict(zip(waiting, blocks[kind])) for kind, waiting in self.waiting.items()}  # fp32
        self.posted = {}
        for kind in self.waiting:
            self._post_next(kind)

    def _post_next(self, kind):
        if self.waiting[kind]:
            key = self.waiting[kind].pop(0)
            group = self.groups[kind]  # each kind on its own group: its messages matched in their own order
            self.posted[kind, key] = dist.irecv(self.buffers[kind][key], self.source[kind], group=group)

    def take(self, kind, i, k):
        """Wait for the input of operation (kind, i, k), post the next receive of its kind, return the input."""
        self.posted.pop((kind, (i, k))).wait()
        self._post_next(kind)
        return self.buffers[kind][i, k]


def run_schedule(rank, order, inputs, targets, micro_batches, grid, n_embd, loss_weight=1.0, clock=time.perf_counter):
    """Execute one rank's operation list (its PipelineRank's chunks) over m micro-batches of inputs/targets (B, T).

    Sends are non-blocking (waited for at the end) and receives are posted ahead (Inbox) and
    waited for only when the operation needs its input, so a rank waits only for data it
    needs: the pipeline cannot deadlock as long as the schedule is valid.
    Each micro-batch's loss is divided by m, so the summed gradients equal those of the
    whole batch (times loss_weight: 1 / accumulation steps). Returns (loss or None, the rank's
    timeline as Slots, computing ("F"/"B") and waiting ("wait"), peak stored activations).
    """
    micro_inputs, micro_targets = inputs.chunk(micro_batches), targets.chunk(micro_batches)
    rows, T = micro_inputs[0].shape
    order = [operation(op) for op in order]
    shards = rank.chunks[0].sequence_shards
    shape = (rows, T // shards, n_embd)  # activations between stages: (B/m, T, C), T/tp under SP
    inbox = Inbox(rank, order, shape, grid, next(rank.parameters()).device)
    previous, following = ring_neighbours(grid)
    stored, pending, records, loss, peak = {}, [], [], None, 0

    def timed(kind, i, k, fn):
        start = clock()
        result = fn()
        records.append(Slot(kind, i, start, clock(), k))
        return result

    def send(kind, tensor, to):
        pending.append(dist.isend(counted("pp", tensor.contiguous()), to, group=grid.pp_message_groups[kind]))

    for kind, i, k in order:
        stage = rank.chunks[k]
        if kind == "F":
            x = (
                micro_inputs[i]
                if stage.is_first
                else timed("wait", i, k, lambda: inbox.take("F", i, k).requires_grad_())
            )
            out = timed("F", i, k, lambda: stage(x, micro_targets[i] if stage.is_last else None))
            if stage.is_last:
                out = out / micro_batches
                loss = out.detach() if loss is None else loss + out.detach()
                out = out * loss_weight
            else:
                send("F", out.detach(), following)
            stored[i, k] = (x, out)
            peak = max(peak, len(stored))
        elif kind == "B":
            x, out = stored.pop((i, k))
            grad = None if stage.is_last else timed("wait", i, k, lambda: inbox.take("B", i, k))
            timed("B", i, k, lambda: out.backward(grad))
            if not stage.is_first:
                send("B", x.grad, previous)
        else:
            raise ValueError(f"unknown pipeline operation {kind!r}")
    for work in pending:
        work.wait()
    return loss, records, peak


class PipelineModel:
    """The model as a pipeline rank holds it: its stage, or its v chunks when interleaved (module, a PipelineRank:
    their matrices cut across the TP group when tp > 1, cuts), run under the layout's schedule over its
    micro-batches; gradients averaged over the dp replicas of the rank by its DP engine (dp). model_for_rank
    builds it. It answers the training loop's interface, layout.RankModel."""

    def __init__(self, module, grid, cuts, positions, dp, layout, n_embd, autocast=contextlib.nullcontext()):
        self.module, self.grid, self.cuts, self.positions, self.dp = module, grid, cuts, positions, dp
        self.micro_batches, self.virtual_stages, self.n_embd = layout.micro_batches, layout.virtual_stages, n_embd
        self.autocast, self.device = autocast, next(module.parameters()).device
        v = layout.virtual_stages
        scheduled = schedule_for(layout.schedule, v)
        check_schedule(scheduled, grid.pp, self.micro_batches, v)
        self.order = scheduled(grid.pp, self.micro_batches, grid.pp_rank)
        self.in_flight = peak_activations(self.order) / v  # whole stages' worth kept at once (a chunk is 1/v of one)
        self.records = []  # this rank's timeline of the latest step
        self.zero_stage = layout.zero_stage

    def _from_last_stage(self, loss):
        """The loss lives on the last stage; every stage gets it, to log and to judge incidents alike."""
        loss = torch.zeros((), device=self.device) if loss is None else loss.float()
        dist.broadcast(loss, src=self.grid.pp_ranks[-1], group=self.grid.pp_group)
        return loss

    def forward_backward(self, x, y, loss_weight, sync=True):
        """One micro-step: the schedule over m micro-batches of (x, y); returns the mean loss.
        sync is for the interface: the DP average starts in reduce_gradients, after the schedule."""
        x, y = cut_sequences(x, y, self.positions)
        with self.autocast:
            loss, self.records, _ = run_schedule(
                self.module, self.order, x, y, self.micro_batches, self.grid, self.n_embd, loss_weight
            )
        return mean_over_cp(self._from_last_stage(loss), self.grid)

    @torch.no_grad()
    def loss(self, x, y):
        """Forward only (evaluation): the mean loss of (x, y)."""
        forwards = [op for op in self.order if op[0] == "F"]
        x, y = cut_sequences(x, y, self.positions)
        with self.autocast:
            loss, _, _ = run_schedule(self.module, forwards, x, y, self.micro_batches, self.grid, self.n_embd)
        return mean_over_cp(self._from_last_stage(loss), self.grid)

    def reduce_gradients(self):
        sync_tied_embedding(self.module, self.grid)
        if self.dp is not None:
            self.dp.finish()

    def clear_gradients(self):
        clear_gradients(self.module, self.dp)

    def grad_norm(self):
        return sharded_grad_norm(self.local_parameters(), self.grid, self.dp, self.zero_stage, self.module.tied_copy())

    def local_parameters(self):
        names = self.module.global_names()
        return [(names[name], p, self.cuts.get(names[name])) for name, p in self.module.named_parameters()]

    def timeline(self):
        """The last training step as every stage ran it, gathered over the pipeline group: [stage: [Slot]]."""
        timeline = [None] * self.grid.pp
        dist.all_gather_object(timeline, self.records, group=self.grid.pp_group)
        return timeline


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--micro_batches", type=int, default=8)
    parser.add_argument("--virtual_stages", type=int, default=2, help="chunks a rank for the interleaved row")
    args = parser.parse_args()
    p, m, v = args.stages, args.micro_batches, args.virtual_stages
    rows = [(name, schedule, 1) for name, schedule in SCHEDULES.items()]
    if v > 1 and m % p:
        print(f"(no interleaved row: it runs micro-batches in groups of p = {p}, and m = {m} is not a multiple)")
    elif v > 1:
        rows.append((f"1f1b v={v}", schedule_for("1f1b", v), v))
    for name, schedule, chunks in rows:
        bubble = bubble_fraction(logical_timeline(schedule, p, m))
        peak = max(peak_activations(schedule(p, m, s)) for s in range(p)) / chunks
        print(
            f"{name:>10}: logical bubble {bubble:.3f} (formula (p-1)/({'v ' if chunks > 1 else ''}m+p-1) = "
            f"{(p - 1) / (chunks * m + p - 1):.3f}), peak stored activations per rank {peak:g} stages' worth"
        )


if __name__ == "__main__":
    main()
