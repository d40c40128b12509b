# wrong: only weights, optimizer, step, data and RNG: the monitor's baselines and the runbook's state are left out
# in: Checkpointer.snapshot
return {
    "model": checkpoint.full_state_dict(self.model),
    "optimizer": checkpoint.full_optimizer_state_dict(self.optimizer, self.model, self.optimizer_groups),
    "scaler": self.scaler.state_dict(),
    "step": step,
    "data": self.data.state_dict(),
    "rng": checkpoint.rng_state(),
    "config": self.identity,
    "meta": self.meta,
}
