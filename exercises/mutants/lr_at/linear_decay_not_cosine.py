# wrong: a straight line from learning_rate down to min_lr instead of the cosine
decay_iters = cfg.lr_decay_iters or cfg.max_iters
if step < cfg.warmup_iters:
    return cfg.learning_rate * (step + 1) / cfg.warmup_iters
if step >= decay_iters:
    return cfg.min_lr
progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)  # 0 -> 1
return cfg.learning_rate - progress * (cfg.learning_rate - cfg.min_lr)
