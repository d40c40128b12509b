# wrong: the decay's progress is measured from step 0, not from the end of warmup
decay_iters = cfg.lr_decay_iters or cfg.max_iters
if step < cfg.warmup_iters:
    return cfg.learning_rate * (step + 1) / cfg.warmup_iters
if step >= decay_iters:
    return cfg.min_lr
progress = step / decay_iters
return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
