# wrong: --resume_without is ignored: every piece is restored whatever forget names
# in: restore_checkpoint
checkpoint.load_full_state_dict(run.model, state["model"], run.grid)
if "optimizer" in state:
    checkpoint.load_full_optimizer_state_dict(run.optimizer, state["optimizer"], run.model, run.grid,
                                              run.optimizer_groups)
if state.get("scaler"):
    run.scaler.load_state_dict(state["scaler"])
run.train_stream.load_state_dict(state["data"])
checkpoint.set_rng_state(state["rng"])
run.monitor.load_state_dict(state["monitor"])
run.recovery.load_state_dict(state["recovery"])
return state["step"]
