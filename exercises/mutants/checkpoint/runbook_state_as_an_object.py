# wrong: the runbook's state and the monitor saved as live objects, which a checkpoint file cannot hold
# in: Checkpointer.snapshot
return {
    "model": checkpoint.full_state_dict(self.model),
    "optimizer": checkpoint.full_optimizer_state_dict(self.optimizer, self.model, self.optimizer_groups),
    "scaler": self.scaler.state_dict(),
    "step": step,
    "data": self.data.state_dict(),
    "rng": checkpoint.rng_state(),
    "monitor": self.monitor,
    "recovery": self.recovery,
    "config": self.identity,
    "meta": self.meta,
}
