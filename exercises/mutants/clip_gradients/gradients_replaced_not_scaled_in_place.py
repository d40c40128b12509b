# wrong: each gradient is replaced by a new tensor instead of scaled in place: DP's buckets keep the unclipped values
if max_norm > 0:
    scale = torch.clamp(max_norm / (grad_norm + 1e-6), max=1.0)
    for p in parameters:
        if p.grad is not None:
            p.grad = p.grad * scale.to(p.grad.dtype)
