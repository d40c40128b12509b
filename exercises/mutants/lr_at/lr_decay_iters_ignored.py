# wrong: the decay always ends at max_iters: --lr_decay_iters is ignored
decay_iters = cfg.max_iters
if step < cfg.warmup_iters:
    return cfg.learning_rate * (step + 1) / cfg.warmup_iters
if step >= decay_iters:
    return cfg.min_lr
progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
