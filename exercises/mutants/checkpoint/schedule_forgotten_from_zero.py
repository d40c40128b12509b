# wrong: --resume_without schedule restarts the schedule at step 0 instead of at the resumed step
# in: restore_checkpoint
checkpoint.load_full_state_dict(run.model, state["model"], run.grid)
if "optimizer" in state and "optimizer" not in forget:
    checkpoint.load_full_optimizer_state_dict(run.optimizer, state["optimizer"], run.model, run.grid,
                                              run.optimizer_groups)
if state.get("scaler"):
    run.scaler.load_state_dict(state["scaler"])
run.train_stream.load_state_dict({"position": 0} if "data_position" in forget else state["data"])
checkpoint.set_rng_state(state["rng"])
run.monitor.load_state_dict(state["monitor"])
run.recovery.load_state_dict(state["recovery"])
if "schedule" in forget:
    run.recovery.schedule_from = 0
return state["step"]
