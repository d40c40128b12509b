# wrong: the fp16 loss scaler is left out of the checkpoint
# in: Checkpointer.snapshot
return {
    "model": checkpoint.full_state_dict(self.model),
    "optimizer": checkpoint.full_optimizer_state_dict(self.optimizer, self.model, self.optimizer_groups),
    "step": step,
    "data": self.data.state_dict(),
    "rng": checkpoint.rng_state(),
    "monitor": self.monitor.state_dict(),
    "recovery": self.recovery.state_dict(),
    "config": self.identity,
    "meta": self.meta,
}
