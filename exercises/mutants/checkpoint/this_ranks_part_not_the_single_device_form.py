# wrong: weights and AdamW state as this rank holds them (a TP slice, a pipeline stage), not in single-device form
# in: Checkpointer.snapshot
return {
    "model": self.model.module.state_dict(),
    "optimizer": self.optimizer.state_dict(),
    "scaler": self.scaler.state_dict(),
    "step": step,
    "data": self.data.state_dict(),
    "rng": checkpoint.rng_state(),
    "monitor": self.monitor.state_dict(),
    "recovery": self.recovery.state_dict(),
    "config": self.identity,
    "meta": self.meta,
}
