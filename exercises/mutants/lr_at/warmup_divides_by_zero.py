# wrong: the warmup factor min(1, (step + 1) / warmup_iters) is computed on every step: warmup_iters = 0 divides by 0
decay_iters = cfg.lr_decay_iters or cfg.max_iters
warm = min(1.0, (step + 1) / cfg.warmup_iters)
if step >= decay_iters:
    return cfg.min_lr
progress = max(0, step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
return warm * (cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr))
