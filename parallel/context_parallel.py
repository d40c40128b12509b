"""Context parallelism by hand: the sequence cut across cp ranks, attention computed around a ring (ring attention,
Liu et al. 2023, arXiv:2310.01889), each rank holding an early and a late piece of every sequence (the causal load
balance Llama 3 and Megatron's context parallelism use).

    torchrun --standalone --nproc_per_node=2 train.py --cp 2          # each rank holds T/2 positions

Long context makes every activation grow with T. Attention is the only layer where positions meet: the norms,
projections, MLP and loss each work on one position at a time. So each rank of a cp group keeps T/cp positions of
every sequence, and only attention talks. It computes its queries against its own keys and values first, then
passes the keys and values it holds to the next rank of the ring and takes the previous rank's, cp - 1 times, each
time merging the block's softmax into the running one (merge_block: flash attention's online softmax, the running
max and sum carried as one number, their log-sum-exp). Backward is autograd's, over the ring: each pass's backward
sends the keys' and values' gradient back to the rank they came from. A block's (T/cp, T/cp) scores are rebuilt in
backward rather than kept (torch.utils.checkpoint, as flash attention rebuilds them), so what a rank keeps for
backward grows linearly in T.

Causal attention gives late positions more keys to see than early ones: cut in cp contiguous pieces, the last rank
would do most of the work. Cut T into 2 cp chunks instead and give rank r chunks r and 2 cp - 1 - r, an early one
and a late one (zigzag_positions): every rank then has the same number of (query, key) pairs under the mask, and
each step of the ring the same work: all of a rank's queries see an earlier rank's early chunk and none of its late
one, and only its late queries see a later rank's keys, all of them. Past its own block, then, each rank computes
half a block a step (ring_attention), and no score the mask would throw away.

The parameters are whole on every rank of the group, which sees T/cp positions of each sequence: their gradients
are averaged over it as backward makes them (average_over_cp), before any data-parallel engine sees them.
"""

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from model import CausalSelfAttention, grouped_heads
from parallel.comm_count import counted
from parallel.grid import all_reduce_mean

MASKED = -1e30  # a masked score: finite, so a row with no key to see gets weights 0 and gradients 0, never NaN


def zigzag_positions(T, cp, rank, device=None):
    """The (T/cp,) positions rank holds: chunks rank and 2 cp - 1 - rank of T cut into 2 cp equal chunks."""
    chunk = T // (2 * cp)
    early = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    late = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, device=device)
    return torch.cat((early, late))


def causal_pairs(T, cp, rank):
    """(query, key) pairs rank computes that the causal mask keeps: its share of attention's work."""
    mine = zigzag_positions(T, cp, rank)
    return int((mine[:, None] >= torch.arange(T)[None, :]).sum())


def block_attention(q, k, v, q_positions, k_positions):
    """q (B, H, Tq, D) against one block of keys and values k, v (B, H, Tk, D), masked by their sequence positions
    (Tq,) and (Tk,): a key later than the query is not seen. Returns (the block's output (B, H, Tq, D), normalized
    within the block, and the log of its softmax's sum (B, H, Tq)), both fp32."""
    scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    scores = scores.masked_fill(k_positions[None, :] > q_positions[:, None], MASKED)
    lse = scores.logsumexp(dim=-1)  # (B, H, Tq): max + log(sum of exp(score - max)), the two numbers in one
    return (scores - lse.unsqueeze(-1)).exp() @ v.float(), lse


def merge_block(out, lse, block_out, block_lse):
    """The online softmax: a running attention output (B, H, Tq, D), softmax over the keys seen so far whose
    log-sum-exp is lse (B, H, Tq), merged with one more block's (block_out, block_lse) -> (out, lse) over both.

    softmax over all keys = each part's softmax reweighted by its share of the total sum: a part whose scores sum
    (in exp) to e^lse gets e^(lse - merged), where e^merged = e^lse + e^block_lse. Stable at any scale of scores:
    a log-sum-exp past 88.7 overflows e^lse in fp32, and one below -103 underflows it to 0."""
    # exercise ring_attention: begin
    merged = torch.logaddexp(lse, block_lse)  # log(e^lse + e^block_lse), without overflow
    out = out * (lse - merged).exp().unsqueeze(-1) + block_out * (block_lse - merged).exp().unsqueeze(-1)
    return out, merged
    # exercise ring_attention: end


class Ring:
    """The cp ranks of a group in ring order: this rank's place, and one step around it."""

    def __init__(self, ranks, index, group):
        self.ranks, self.index, self.group, self.size = ranks, index, group, len(ranks)

    def shift(self, x, step):
        """Send x `step` places on around the ring, and take what the rank `step` places back sends."""
        x, received = x.contiguous(), torch.empty_like(x)
        to, source = self.ranks[(self.index + step) % self.size], self.ranks[(self.index - step) % self.size]
        ops = [
            dist.P2POp(dist.isend, counted("cp", x), to, self.group),
            dist.P2POp(dist.irecv, received, source, self.group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return received


class PassAround(torch.autograd.Function):
    """A ring step autograd can go back through: forward, the tensor to the next rank; backward, its gradient back
    to the rank it came from."""

    @staticmethod
    def forward(ctx, x, ring):
        ctx.ring = ring
        return ring.shift(x, 1)

    @staticmethod
    def backward(ctx, grad):
        return ctx.ring.shift(grad, -1), None


def ring_attention(q, k, v, ring, T):
    """Causal attention of this rank's queries q (B, H, T/cp, D) over the whole sequence's keys and values, of
    which this rank holds k, v (B, kv_heads, T/cp, D): its own block first (the diagonal, where every query sees at
    least itself), then cp - 1 blocks passed around the ring, merged as they come. -> (B, H, T/cp, D).

    Past the diagonal only the half of a block the mask keeps is computed: an earlier rank's early chunk against
    all of this rank's queries, or a later rank's whole block against this rank's late queries."""
    half = q.size(2) // 2  # the early chunk's positions; the late chunk's follow
    mine = zigzag_positions(T, ring.size, ring.index, q.device)

    def block(q, k, v, q_positions, k_positions):  # GQA: the narrow keys and values travel, widened on arrival
        return block_attention(q, grouped_heads(k, q.size(1)), grouped_heads(v, q.size(1)), q_positions, k_positions)

    def attend(queries, kv, source, keys=slice(None)):
        """One block, its (Tq, Tk) scores rebuilt in backward rather than kept, as flash attention does: backward
        keeps the block's inputs (the keys and values the ring brought) and its output, linear in T/cp."""
        inputs = (q[:, :, queries], kv[0][:, :, keys], kv[1][:, :, keys], mine[queries])
        k_positions = zigzag_positions(T, ring.size, source, q.device)[keys]
        if not torch.is_grad_enabled():
            return block(*inputs, k_positions)
        return checkpoint(block, *inputs, k_positions, use_reentrant=False)

    kv = torch.stack((k, v))  # (2, B, kv_heads, T/cp, D): one message a step, so every rank's passes pair up
    out, lse = attend(slice(None), kv, ring.index)
    for step in range(1, ring.size):
        kv = PassAround.apply(kv, ring)
        source = (ring.index - step) % ring.size
        if source < ring.index:  # an earlier rank: its early chunk, seen by every query here
            out, lse = merge_block(out, lse, *attend(slice(None), kv, source, slice(None, half)))
        else:  # a later rank: all of it, seen by the late queries only
            late, late_lse = merge_block(out[:, :, half:], lse[:, :, half:], *attend(slice(half, None), kv, source))
            out, lse = torch.cat((out[:, :, :half], late), dim=2), torch.cat((lse[:, :, :half], late_lse), dim=2)
    return out.to(v.dtype)


class RingSelfAttention(CausalSelfAttention):
    """The model's attention with its queries at this rank's positions and its keys and values around the ring."""

    @classmethod
    def of(cls, attention, ring, T):
        """The attention module itself, changed in place: its parameters keep their names and values."""
        attention.__class__ = cls
        attention.ring, attention.T = ring, T
        return attention

    def positions(self, start, T, device):
        return zigzag_positions(self.T, self.ring.size, self.ring.index, device)

    def kernel(self, q, k, v, dropout_p):
        return ring_attention(q, k, v, self.ring, self.T)


class ContextParallelPositions(nn.Module):
    """Learned positions (GPT-2's wpe) of this rank's positions: GPT.forward asks for its T/cp and gets the
    rows of the positions it holds. The table is whole on every rank."""

    def __init__(self, positions, local):
        super().__init__()
        self.weight, self.local = positions.weight, local  # the same Parameter: wpe.weight

    def forward(self, pos):  # (T/cp,) -> (T/cp, C)
        return F.embedding(self.local.to(pos.device), self.weight)


def average_over_cp(parameters, grid):
    """Average each parameter's gradient over the cp group as backward makes it: each rank's is that of its T/cp
    positions' mean loss, and the sequence's mean loss is the mean over the group. parameters: those this rank
    updates (a pipeline stage's, with its copy of the tied matrix)."""

    def averaged(grad):
        grad = grad.clone()
        dist.all_reduce(counted("cp", grad), group=grid.cp_group)
        return grad / grid.cp

    if grid.cp > 1:
        for p in parameters:
            p.register_hook(averaged)


def context_parallel(model, grid, sequence_parallel=False):
    """Cut a GPT's sequence across the cp group, in place (after tensor_parallel): attention around the ring,
    learned positions at this rank's (under sequence parallelism, its TP rank's share of them). Returns this rank's
    positions (T/cp,), which its inputs and targets are cut to; None when cp is 1. The rank's model then averages
    its gradients over the group (average_over_cp)."""
    if grid.cp == 1:
        return None
    T = model.config.block_size
    ring = Ring(grid.cp_ranks, grid.cp_rank, grid.cp_group)
    for block in model.blocks:
        RingSelfAttention.of(block.attn, ring, T)
    local = zigzag_positions(T, grid.cp, grid.cp_rank)
    if model.wpe is not None:
        rows = local.chunk(grid.tp)[grid.tp_rank] if sequence_parallel else local
        model.wpe = ContextParallelPositions(model.wpe, rows)
    return local


def cut_sequences(x, y, positions):
    """Inputs and targets (B, T) cut to this rank's positions (B, T/cp); as they are where positions is None."""
    return (x, y) if positions is None else (x[:, positions.to(x.device)], y[:, positions.to(y.device)])


def mean_over_cp(loss, grid):
    """The sequence's mean loss from each rank's mean over its T/cp positions (equal counts): their mean. A scalar,
    for the log and the detectors: not counted, as the other scalars of a step are not."""
    return all_reduce_mean(loss.detach().clone(), grid.cp_group, grid.cp) if grid.cp > 1 else loss
