# wrong: --resume_without is ignored: every piece is restored whatever forget names
# in: Checkpointer.restore
checkpoint.load_full_state_dict(self.model, state["model"])
if "optimizer" in state:
    checkpoint.load_full_optimizer_state_dict(self.optimizer, state["optimizer"], self.model,
                                              self.optimizer_groups)
if state.get("scaler"):
    self.scaler.load_state_dict(state["scaler"])
self.data.load_state_dict(state["data"])
checkpoint.set_rng_state(state["rng"])
self.monitor.load_state_dict(state["monitor"])
self.recovery.load_state_dict(state["recovery"])
return state["step"]
