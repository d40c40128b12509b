"""The communication counter: the bytes each rank hands to a training step's all-reduces and sends, per dimension
(dp, tp, pp, cp), against its closed form (closed_forms.comm_bytes_per_step). Below every parallelism that counts."""

import torch
import torch.distributed as dist

# Every all-reduce and send carrying a step's gradients or activations hands its tensor through counted(dimension,
# tensor): an integer add on the host, free when nobody reads it. Not counted: a step's few scalars (loss, grad
# norm), the start-up broadcast, checkpoint gathers. Evaluation's forwards count too, so the loop zeroes the count
# each step. A ring all-reduce of P bytes in a group of n puts 2 (n - 1) / n P on each rank's link; the count is P.

DIMENSIONS = ("dp", "tp", "pp", "cp")
comm_bytes = dict.fromkeys(DIMENSIONS, 0)  # bytes this rank handed over since the last take_comm_bytes()


def counted(dimension, tensor):
    """tensor, after adding its bytes to this rank's count for dimension dp, tp, pp or cp."""
    comm_bytes[dimension] += tensor.numel() * tensor.element_size()
    return tensor


def take_comm_bytes():
    """{dimension: bytes} counted since the last call; the counts start again from zero."""
    taken = dict(comm_bytes)
    comm_bytes.update(dict.fromkeys(DIMENSIONS, 0))
    return taken


def take_busiest_comm_bytes(device):
    """{dimension: the most bytes any rank counted since its last take}: the rank that sets the
    pace in each dimension. A collective (an int64 max over the world): every rank calls it."""
    taken = take_comm_bytes()
    if dist.is_initialized():
        counts = torch.tensor(list(taken.values()), dtype=torch.int64, device=device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        taken = dict(zip(taken, counts.tolist()))
    return taken
