# wrong: every parameter is assumed to have a gradient: an unused one (grad None) crashes
if max_norm > 0:
    scale = torch.clamp(max_norm / (grad_norm + 1e-6), max=1.0)
    for p in parameters:
        p.grad.mul_(scale.to(p.grad.dtype))
