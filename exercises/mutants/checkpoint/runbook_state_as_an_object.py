# wrong: the runbook's state and the monitor saved as live objects, which a checkpoint file cannot hold
# in: checkpoint_state
return {
    "model": checkpoint.full_state_dict(run.model, run.grid),
    "optimizer": checkpoint.full_optimizer_state_dict(run.optimizer, run.model, run.grid, run.optimizer_groups),
    "scaler": run.scaler.state_dict(),
    "step": step,
    "data": run.train_stream.state_dict(),
    "rng": checkpoint.rng_state(),
    "monitor": run.monitor,
    "recovery": run.recovery,
    "config": run.identity,
    "meta": run.meta,
}
