# wrong: each tensor clipped to max_norm on its own
if max_norm > 0:
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(torch.clamp(max_norm / (p.grad.norm() + 1e-6), max=1.0))
