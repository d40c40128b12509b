# wrong: each gradient value is clamped to [-max_norm, max_norm] (clip by value), not the global norm
if max_norm > 0:
    for p in parameters:
        if p.grad is not None:
            p.grad.clamp_(-max_norm, max_norm)
