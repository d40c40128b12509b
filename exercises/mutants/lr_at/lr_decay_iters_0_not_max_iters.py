# wrong: lr_decay_iters = 0 is taken literally instead of meaning max_iters: the LR drops to min_lr after warmup
decay_iters = cfg.lr_decay_iters
if step < cfg.warmup_iters:
    return cfg.learning_rate * (step + 1) / cfg.warmup_iters
if step >= decay_iters:
    return cfg.min_lr
progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
