# wrong: no clamp at 1: gradients below max_norm are scaled up to it
if max_norm > 0:
    scale = max_norm / (grad_norm + 1e-6)
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(scale.to(p.grad.dtype))
