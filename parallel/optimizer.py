"""What the update reads across ranks: AdamW's moments per parameter, and the global gradient norm over every cut.

Checkpoints read and restore every optimizer through AdamW's moments() and load_moments(), whatever the layout
(zero.ShardedAdamW gathers and cuts its shards behind the same two calls). The gradient norm that clipping scales
by is the whole model's, summed over TP slices, pipeline stages and ZeRO's shards, so every rank clips alike.
"""

import torch
import torch.distributed as dist

# ----------------------------------------------------------------------------
# The optimizer, its moments per parameter


class AdamW(torch.optim.AdamW):
    """torch's AdamW, giving and taking its moments per parameter."""

    def moments(self):
        """{parameter: {"step", "exp_avg", "exp_avg_sq"}} for every parameter this rank holds. {} before the
        first step. Every rank of the DP group must call it (ZeRO's gathers the moments over the group)."""
        return {p: self.state[p] for group in self.param_groups for p in group["params"] if p in self.state}

    def load_moments(self, moments, param_groups):
        """The inverse of moments(): {parameter: its AdamW state}, and the groups' hyperparameters
        (a state dict's "param_groups", in this optimizer's group order)."""
        index = {p: i for i, p in enumerate(p for group in self.param_groups for p in group["params"])}
        ours = self.state_dict()["param_groups"]  # the hyperparameters from the checkpoint, our parameter indices
        self.load_state_dict(
            {
                "state": {index[p]: state for p, state in moments.items()},
                "param_groups": [dict(g, params=o["params"]) for g, o in zip(param_groups, ours)],
            }
        )


def adamw(groups, **options):
    """AdamW over groups [(parameters, weight decay)]: what a rank updates when it holds its parameters whole
    (ZeRO's engine builds its own over its pieces: zero.ZeroStage.optimizer)."""
    return AdamW([{"params": params, "weight_decay": decay} for params, decay in groups], **options)


# ----------------------------------------------------------------------------
# The global gradient norm, over TP slices, pipeline stages and ZeRO's shards


def global_grad_norm(sliced, whole, grid=None, sharded_over_dp=False, device=None):
    """L2 norm of the whole model's gradient, the sum of squares in fp32.

    sliced: this rank's gradients of tensor-parallel slices; their squares are summed
    over the TP group. whole: gradients every TP rank holds in full (norm weights,
    positions); they count once. Each pipeline stage holds other parameters, so the
    stages' sums add up over the PP group. sharded_over_dp (ZeRO): each DP rank holds
    its shard of the gradients, so both sums first add up over the DP group. device: where
    the sums live when this rank holds no gradient (NCCL reduces device tensors only)."""
    device = (sliced + whole)[0].device if sliced + whole else device

    def sum_of_squares(grads):  # one multi-tensor kernel instead of three small ops per gradient
        if not grads:
            return torch.zeros((), device=device)
        return torch.nn.utils.get_total_norm([g.detach().float() for g in grads], foreach=True).pow(2)

    sliced_sq, whole_sq = sum_of_squares(sliced), sum_of_squares(whole)
    if sharded_over_dp and grid.dp > 1:
        sums = torch.stack([sliced_sq, whole_sq])
        dist.all_reduce(sums, group=grid.dp_group)
        sliced_sq, whole_sq = sums
    if grid is not None and grid.tp > 1:
        dist.all_reduce(sliced_sq, group=grid.tp_group)
    total = sliced_sq + whole_sq
    if grid is not None and grid.pp > 1:
        dist.all_reduce(total, group=grid.pp_group)
    return torch.sqrt(total)


def sharded_grad_norm(local_parameters, grid, dp=None, zero_stage=0, skip=None):
    """global_grad_norm of the gradients of (single-device name, parameter, Cut or None) triples:
    a parameter with a Cut is a TP slice, one without is whole. dp: the data-parallel engine,
    which holds the averaged gradients (under ZeRO, zero_stage 1 or 2, this rank's shard of them). skip: a
    parameter not to count (a pipeline's second copy of the tied matrix)."""
    cut_of = {p: cut for _, p, cut in local_parameters}
    gradients = dp.gradients() if dp is not None else [(p, p.grad) for p in cut_of if p.grad is not None]
    grads = [(g, cut_of[p]) for p, g in gradients if p is not skip]
    sliced, whole = [g for g, cut in grads if cut is not None], [g for g, cut in grads if cut is None]
    device = local_parameters[0][1].device
    return global_grad_norm(sliced, whole, grid, zero_stage > 0, device)
