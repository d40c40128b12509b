# wrong: only weights, optimizer, step, data and RNG: the monitor's baselines and the runbook's state are left out
# in: checkpoint_state
return {
    "model": checkpoint.full_state_dict(run.model, run.grid),
    "optimizer": checkpoint.full_optimizer_state_dict(run.optimizer, run.model, run.grid, run.optimizer_groups),
    "scaler": run.scaler.state_dict(),
    "step": step,
    "data": run.train_stream.state_dict(),
    "rng": checkpoint.rng_state(),
    "config": run.identity,
    "meta": run.meta,
}
