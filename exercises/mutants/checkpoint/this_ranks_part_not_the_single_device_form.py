# wrong: weights and AdamW state as this rank holds them (a TP slice, a pipeline stage), not in single-device form
# in: checkpoint_state
return {
    "model": run.model.module.state_dict(),
    "optimizer": run.optimizer.state_dict(),
    "scaler": run.scaler.state_dict(),
    "step": step,
    "data": run.train_stream.state_dict(),
    "rng": checkpoint.rng_state(),
    "monitor": run.monitor.state_dict(),
    "recovery": run.recovery.state_dict(),
    "config": run.identity,
    "meta": run.meta,
}
