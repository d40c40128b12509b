# wrong: the optimizer state is taken for granted: a checkpoint without it fails even under --reset_optimizer
# in: Checkpointer.restore
checkpoint.load_full_state_dict(self.model, state["model"])
if "optimizer" not in forget:
    checkpoint.load_full_optimizer_state_dict(self.optimizer, state["optimizer"], self.model,
                                              self.optimizer_groups)
if state.get("scaler"):
    self.scaler.load_state_dict(state["scaler"])
self.data.load_state_dict({"position": 0} if "data_position" in forget else state["data"])
checkpoint.set_rng_state(state["rng"])
self.monitor.load_state_dict(state["monitor"])
self.recovery.load_state_dict(state["recovery"])
if "schedule" in forget:
    self.recovery.schedule_from = state["step"]
return state["step"]
