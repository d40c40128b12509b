"""A run's checkpoints as the loop lives them: what a checkpoint holds and the resume that puts each piece back,
loading the newest that verifies (rank 0 chooses, every rank loads its choice), and saving one with its mirror
and retention. checkpoint.py holds the single-device form and the folders on disk."""

import os

from errors import UserError
from machinery.components import checkpoint
from machinery.components.run_folder import config_changes, fill_new_fields, identity_defaults
from machinery.job.cluster import raise_on_every_rank, say


class Checkpointer:
    """Saves and restores what the next step depends on: the learner's model, optimizer and loss scaler, the data's
    position, every random generator, the health monitor's baselines and the incidents' Recovery, each read from
    (and put back into) the component that owns it. Every rank calls its methods."""

    def __init__(self, job, folder, learner, data, incidents):
        self.configs, self.grid, self.is_rank0 = job.configs, job.grid, job.is_rank0
        self.folder = folder
        self.model, self.optimizer, self.scaler = learner.model, learner.optimizer, learner.scaler
        self.optimizer_groups = learner.optimizer_groups  # how a checkpoint lists each group's parameters
        self.data, self.meta = data, data.meta
        self.monitor, self.recovery = incidents.monitor, incidents.recovery
        self.identity = folder.identity

    def snapshot(self, step):
        """Everything the next step depends on. The chapter's three pieces: "model" and "optimizer" (the weights,
        AdamW's moments), "step" (where the LR schedule goes on) and "data" (the stream's position); "rng",
        "monitor" (baselines), "recovery" (the runbook) and "scaler" make the resume exact; "config" and "meta" name
        the run. Weights and moments are in single-device form (checkpoint.py): any layout resumes them. Every rank
        calls it: it gathers the parts."""
        # exercise checkpoint, Checkpointer.snapshot: begin
        return {
            "model": checkpoint.full_state_dict(self.model),
            "optimizer": checkpoint.full_optimizer_state_dict(self.optimizer, self.model, self.optimizer_groups),
            "scaler": self.scaler.state_dict(),  # empty unless fp16 loss scaling is on
            "step": step,
            "data": self.data.state_dict(),
            "rng": checkpoint.rng_state(),
            "monitor": self.monitor.state_dict(),
            "recovery": self.recovery.state_dict(),
            "config": self.identity,
            "meta": self.meta,
        }
        # exercise checkpoint, Checkpointer.snapshot: end

    def restore(self, state, forget=()):
        """The inverse of snapshot: every rank takes its share. Returns the checkpoint's step.

        forget (--resume_without) leaves out some of the chapter's three pieces, to show what each
        one is for: "optimizer" (AdamW restarts from zero moments), "data_position" (train.bin is
        read again from its start) or "schedule" (the LR schedule starts over, warmup first)."""
        recorded = fill_new_fields(state["config"], identity_defaults(self.configs.model, self.configs.train))
        if changed := config_changes(recorded, {"GPTConfig": self.identity["GPTConfig"]}):
            raise UserError(f"the checkpoint holds a model of another shape ({'; '.join(changed)})")
        if "optimizer" not in state and not (self.configs.recovery.reset_optimizer or "optimizer" in forget):
            raise UserError(
                f"the checkpoint of step {state['step']} in {self.folder.ckpt_dir} has no optimizer state. Resuming "
                "would restart AdamW's moment estimates from zero, a jolt in update size and direction that "
                "weights alone cannot undo. Pass --reset_optimizer to accept that and continue anyway."
            )
        if forget:
            say(f"warning: resuming without the checkpoint's {', '.join(forget)} (--resume_without)")
        if "optimizer" not in state or "optimizer" in forget:
            say("warning: no optimizer state taken from the checkpoint; AdamW restarts from zero moments")
        # exercise checkpoint, Checkpointer.restore: begin
        checkpoint.load_full_state_dict(self.model, state["model"])
        if "optimizer" in state and "optimizer" not in forget:
            checkpoint.load_full_optimizer_state_dict(
                self.optimizer, state["optimizer"], self.model, self.optimizer_groups
            )
        if state.get("scaler"):  # empty when the saving run had no fp16 loss scaling
            self.scaler.load_state_dict(state["scaler"])
        self.data.load_state_dict({"position": 0} if "data_position" in forget else state["data"])
        checkpoint.set_rng_state(state["rng"])
        self.monitor.load_state_dict(state["monitor"])
        self.recovery.load_state_dict(state["recovery"])
        if "schedule" in forget:
            self.recovery.schedule_from = state["step"]
        return state["step"]
        # exercise checkpoint, Checkpointer.restore: end

    def load(self, healthy_only=False, ckpt_step=-1):
        """(step, state) of the newest checkpoint that verifies (and is marked healthy, if asked), or None; given
        ckpt_step (--ckpt_step), that step's, which must verify (checkpoint.load_chosen).

        Rank 0 chooses and every rank loads its choice: a rank that looked for itself could find
        a checkpoint rank 0 wrote a moment ago, and resume while the others start afresh. Every
        rank then confirms its load, so none goes on (and rank 0 re-saves that step) while
        another still reads it. Loaded onto the CPU: the RNG states must stay there."""
        latest, problem = None, None
        ckpt_dir = self.folder.ckpt_dir

        def choose():
            nonlocal latest
            if ckpt_step != -1:
                latest = checkpoint.load_chosen(ckpt_dir, ckpt_step, healthy_only=healthy_only)
                return None if latest is None else checkpoint.step_path(ckpt_dir, ckpt_step)
            found = checkpoint.find_latest(self.folder.ckpt_dirs, healthy_only=healthy_only)
            if found is None:
                return None
            step, path, state = found
            if os.path.dirname(path) != ckpt_dir:
                say(f"taking the checkpoint of step {step} from the mirror: {path}")
            latest = step, state
            return path

        path = self.grid.on_rank0(choose)
        if path is not None and not self.is_rank0:
            try:
                state = checkpoint.load(path)
                latest = state["step"], state
            except Exception as e:  # unreadable here: stop every rank with the reason, rather than hang them
                problem = f"rank {self.grid.rank} could not load {path}, which rank 0 chose ({type(e).__name__}: {e})"
        raise_on_every_rank(problem)
        return latest

    def save(self, step):
        """snapshot, written by rank 0 (every rank may read it back after this returns), then retention."""
        healthy = self.monitor.take_healthy_mark()  # before snapshot captures the monitor's state
        state = self.snapshot(step)
        rcfg = self.configs.recovery

        def write():
            checkpoint.save(self.folder.ckpt_dir, step, state, healthy)
            if self.folder.mirror:
                checkpoint.mirror(*self.folder.ckpt_dirs, step)
            for folder in self.folder.ckpt_dirs:
                checkpoint.retain(folder, rcfg.keep_last, rcfg.keep_every)

        self.grid.on_rank0(write)

    def discard_after(self, step):
        """Delete the checkpoints after `step` in every folder (a rollback's future); returns their steps."""
        folders = self.folder.ckpt_dirs
        return self.grid.on_rank0(
            lambda: sorted({s for folder in folders for s in checkpoint.discard_after(folder, step)})
        )
