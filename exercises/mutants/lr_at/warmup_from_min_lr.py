# wrong: the warmup climbs from min_lr, not from 0: step 0 already takes min_lr + a step
decay_iters = cfg.lr_decay_iters or cfg.max_iters
if step < cfg.warmup_iters:
    return cfg.min_lr + (cfg.learning_rate - cfg.min_lr) * (step + 1) / cfg.warmup_iters
if step >= decay_iters:
    return cfg.min_lr
progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
