# wrong: PyTorch's own load_state_dict on this rank's module and optimizer, which hold a part of the model
# in: Checkpointer.restore
self.model.module.load_state_dict(state["model"])
if "optimizer" in state and "optimizer" not in forget:
    self.optimizer.load_state_dict(state["optimizer"])
if state.get("scaler"):
    self.scaler.load_state_dict(state["scaler"])
self.data.load_state_dict({"position": 0} if "data_position" in forget else state["data"])
checkpoint.set_rng_state(state["rng"])
self.monitor.load_state_dict(state["monitor"])
self.recovery.load_state_dict(state["recovery"])
if "schedule" in forget:
    self.recovery.schedule_from = state["step"]
return state["step"]
