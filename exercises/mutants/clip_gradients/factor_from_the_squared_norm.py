# wrong: the factor divides by the squared norm
if max_norm > 0:
    scale = torch.clamp(max_norm / (grad_norm ** 2 + 1e-6), max=1.0)
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.dtype))
