# wrong: the norm is recomputed from the gradients this rank holds, ignoring the global grad_norm it is given
if max_norm > 0:
    grads = [p.grad for p in parameters if p.grad is not None]
    local_norm = torch.sqrt(sum(g.float().pow(2).sum() for g in grads))
    scale = torch.clamp(max_norm / (local_norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(scale.to(g.dtype))
