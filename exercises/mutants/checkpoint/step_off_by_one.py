# wrong: the step saved is the one after the checkpoint's, so a resume skips a step of the schedule
# in: Checkpointer.snapshot
return {
    "model": checkpoint.full_state_dict(self.model),
    "optimizer": checkpoint.full_optimizer_state_dict(self.optimizer, self.model, self.optimizer_groups),
    "scaler": self.scaler.state_dict(),
    "step": step + 1,
    "data": self.data.state_dict(),
    "rng": checkpoint.rng_state(),
    "monitor": self.monitor.state_dict(),
    "recovery": self.recovery.state_dict(),
    "config": self.identity,
    "meta": self.meta,
}
