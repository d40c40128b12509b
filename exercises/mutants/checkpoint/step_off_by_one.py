# wrong: the step saved is the one after the checkpoint's, so a resume skips a step of the schedule
# in: checkpoint_state
return {
    "model": checkpoint.full_state_dict(run.model, run.grid),
    "optimizer": checkpoint.full_optimizer_state_dict(run.optimizer, run.model, run.grid, run.optimizer_groups),
    "scaler": run.scaler.state_dict(),
    "step": step + 1,
    "data": run.train_stream.state_dict(),
    "rng": checkpoint.rng_state(),
    "monitor": run.monitor.state_dict(),
    "recovery": run.recovery.state_dict(),
    "config": run.identity,
    "meta": run.meta,
}
