"""The incident runbook's actions on a run (runbook.py chooses the rung): roll back to the newest healthy
checkpoint, skip the data that led to the incident, lower the LR or re-warm it, and stop, naming what was tried,
when the runbook's last rung is reached."""

from dataclasses import replace

from errors import UserError
from machinery import checkpoint
from machinery.resume import load_checkpoint, restore_checkpoint, save_checkpoint
from machinery.run_folder import append_jsonl, write_jsonl
from machinery.runbook import RUNGS, runbook_response
from machinery.cluster import run_on_rank0


def respond_to_incident(run, step, fired):
    """Climb the runbook for the incident `fired` at `step`; returns the step to go on from."""
    detector, values = fired[0]
    response = runbook_response(run.recovery, step, run.configs.recovery)
    incident = {"step": step, "detector": detector, "values": values, "rung": RUNGS[response], "response": response}
    if response == "stop":
        run.tracker.incident(incident)
        run.tracker.close()
        stop_for_incidents(run, incident)
    bad_end = run.train_stream.position  # the data up to here led to the incident
    recovery = replace(run.recovery, incidents=run.recovery.incidents + 1, last_incident_step=step)
    latest = load_checkpoint(run, healthy_only=True)
    if latest is None:
        raise UserError(f"{detector} at step {step}, and no healthy checkpoint in {run.ckpt_dir} to roll back to")
    _, state = latest
    restored = restore_checkpoint(run, state)
    skipped = [run.train_stream.position, bad_end]
    run.train_stream.position = bad_end
    if response == "lower_lr":
        recovery.lr_scale *= run.configs.recovery.incident_lr_scale
    elif response == "rewarm":
        recovery.rewarm_from = restored
    run.recovery = recovery  # what the incidents did survives the restore of the older state
    discarded = run_on_rank0(
        lambda: sorted({s for folder in run.ckpt_dirs for s in checkpoint.discard_after(folder, restored)}),
        run.is_rank0,
    )
    save_checkpoint(run, restored)  # the restored state, with the skip and the response, so a crash now keeps them
    run.records = [r for r in run.records if r["step"] < restored]
    incident["action"] = {
        "restored_step": restored,
        "skipped_rows": skipped,
        "lr_scale": recovery.lr_scale,
        "rewarm_from": recovery.rewarm_from,
        "discarded_checkpoints": discarded,
    }
    if run.is_rank0:
        write_jsonl(run.metrics_path, run.records)
        append_jsonl(run.incidents_path, incident)
        run.tracker.incident(incident)
    run.say(
        f"INCIDENT at step {step}: {detector} {values} -> rung {RUNGS[response]} ({response}): rolled back to "
        f"step {restored}, skipped data rows {skipped[0]}..{skipped[1]}, LR x{recovery.lr_scale:.3g}",
        flush=True,
    )
    return restored


def stop_for_incidents(run, incident):
    """The runbook's last rung: log the incident and stop every rank, naming what was tried."""
    if run.is_rank0:
        append_jsonl(run.incidents_path, incident)
    tried = "rolling back and skipping data" + (
        f" and an LR lowered to x{run.recovery.lr_scale:.3g}" if run.recovery.lr_scale < 1 else ""
    )
    raise UserError(
        f"stopping after {run.recovery.incidents + 1} incidents (--max_incidents "
        f"{run.configs.recovery.max_incidents}); the last: {incident['detector']} at step {incident['step']} "
        f"{incident['values']}. {tried.capitalize()} did not end them, so suspect something deeper: the data around "
        f"the skipped rows (in {run.incidents_path}), --dtype, the init. The healthy checkpoints in {run.ckpt_dir} "
        "are intact: resume from them with a lower --learning_rate or a longer --warmup_iters, or a larger "
        "--max_incidents."
    )
