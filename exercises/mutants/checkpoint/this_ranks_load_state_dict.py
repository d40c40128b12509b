# wrong: PyTorch's own load_state_dict on this rank's module and optimizer, which hold a part of the model
# in: restore_checkpoint
run.model.module.load_state_dict(state["model"])
if "optimizer" in state and "optimizer" not in forget:
    run.optimizer.load_state_dict(state["optimizer"])
if state.get("scaler"):
    run.scaler.load_state_dict(state["scaler"])
run.train_stream.load_state_dict({"position": 0} if "data_position" in forget else state["data"])
checkpoint.set_rng_state(state["rng"])
run.monitor.load_state_dict(state["monitor"])
run.recovery.load_state_dict(state["recovery"])
if "schedule" in forget:
    run.recovery.schedule_from = state["step"]
return state["step"]
