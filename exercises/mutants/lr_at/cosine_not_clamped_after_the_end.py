# wrong: no floor after lr_decay_iters: the cosine turns back up past the end
decay_iters = cfg.lr_decay_iters or cfg.max_iters
if step < cfg.warmup_iters:
    return cfg.learning_rate * (step + 1) / cfg.warmup_iters
progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
