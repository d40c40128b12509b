"""Incidents, in one place: how a run notices trouble (HealthMonitor), which response the runbook gives
(Recovery.response), what the response does to the run (Incidents.respond: roll back, skip, change the LR,
or stop naming what was tried), and what it leaves on the LR (Recovery.lr_factor). The Recovery is saved with
every checkpoint, so a resumed run keeps it. faults.py plants incidents, for teaching.

A loss curve "talks": it starts at ln V (uniform guessing), falls fast, then flattens. Trouble usually
announces itself: the grad norm jumps, or the val loss turns up while the train loss still falls, before the
loss itself spikes. HealthMonitor computes those leading indicators every step, and flags the incidents that
call for a rollback: a non-finite loss or grad norm, or a loss spike above a robust baseline.

The chapter ranks the causes of a loss spike by how often they strike: bad data
first, then an LR too large for the region the loss is in, then numerics, then
hardware. The response climbs in the same order, one rung per repeat:
  rung 1 (skip): roll back to the newest healthy checkpoint and skip the data that led
      to the incident, at the same LR: bad data is the usual culprit, and costs nothing else.
  rung 2: a repeat within --incident_window steps says the data was not the whole story.
      Roll back and skip again, and lower the LR for the rest of the run (lower_lr, the
      default: it removes the cause; a re-warm climbs back to the same LR within
      rewarm_iters steps and tends to meet the same instability there), or re-warm from
      0 to the scheduled LR (--repeat_response rewarm: the schedule's end stays as planned).
  stop: more than --max_incidents incidents; what is left is deeper (data pipeline,
      precision, init, hardware) and needs a person. The healthy checkpoints stay.
"""

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass, replace

from errors import UserError
from machinery.health.faults import FaultInjector
from machinery.job.cluster import say
from machinery.job.config import RecoveryConfig

# ----------------------------------------------------------------------------
# Detection: leading indicators and incident detectors


class HealthMonitor:
    """Per-step checks against rolling baselines of the last `window` healthy steps.

    - nonfinite: loss or grad norm is NaN or inf. Always an incident.
    - spike: loss > spike_factor x median of recent losses (the median ignores
      the odd noisy step that a mean would follow).
    - grad_z: z = (grad norm - mean) / std of recent grad norms > grad_z_threshold:
      a leading indicator (grad_z_threshold 0 turns it off).
    - val_rise: the val loss rose for val_rise_evals evals in a row while the
      train loss fell: the other leading indicator.
    Detectors named in `triggers` are incidents (roll back); the others only
    warn, and a warning makes the next checkpoint "unhealthy", so a rollback
    will not choose it.
    """

    DETECTORS = ("nonfinite", "spike", "grad_z", "val_rise")

    def __init__(self, window, spike_factor, grad_z_threshold, val_rise_evals, triggers):
        unknown = set(triggers) - set(self.DETECTORS)
        if unknown:
            raise UserError(f"--triggers {','.join(sorted(unknown))}: choose from {','.join(self.DETECTORS)}")
        self.window, self.spike_factor = window, spike_factor
        self.grad_z_threshold, self.val_rise_evals = grad_z_threshold, val_rise_evals
        self.triggers = set(triggers) | {"nonfinite"}
        self.losses, self.grad_norms = deque(maxlen=window), deque(maxlen=window)
        self.evals = []  # (val loss, median train loss at that time)
        self.warned = False  # a leading indicator fired since the last checkpoint

    def baseline_ready(self):
        return len(self.losses) >= max(2, self.window // 2)

    def check_step(self, loss, grad_norm):
        """-> (grad-norm z-score, list of (detector, values) that fired)."""
        # exercise check_step: begin
        fired = []
        z = 0.0
        if self.baseline_ready():
            mean, std = statistics.fmean(self.grad_norms), statistics.pstdev(self.grad_norms)
            z = (grad_norm - mean) / max(std, 1e-8) if math.isfinite(grad_norm) else math.inf
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            fired.append(("nonfinite", {"loss": str(loss), "grad_norm": str(grad_norm)}))  # JSON has no NaN
        elif self.baseline_ready() and loss > self.spike_factor * statistics.median(self.losses):
            fired.append(
                ("spike", {"loss": loss, "baseline": statistics.median(self.losses), "factor": self.spike_factor})
            )
        if self.grad_z_threshold and z > self.grad_z_threshold:
            fired.append(("grad_z", {"grad_norm": grad_norm, "z": z, "threshold": self.grad_z_threshold}))
        if not fired:  # only healthy steps feed the baselines
            self.losses.append(loss)
            self.grad_norms.append(grad_norm)
        return z, self._sort(fired)
        # exercise check_step: end

    def check_eval(self, val_loss):
        """-> list of (detector, values) that fired: val_rise or nothing."""
        train = statistics.median(self.losses) if self.losses else math.inf
        self.evals.append((val_loss, train))
        k = self.val_rise_evals
        recent = self.evals[-(k + 1) :]
        if k and len(recent) == k + 1:
            val_up = all(b[0] > a[0] for a, b in zip(recent, recent[1:]))
            train_down = all(b[1] < a[1] for a, b in zip(recent, recent[1:]))
            if val_up and train_down:
                return self._sort([("val_rise", {"val_losses": [v for v, _ in recent], "evals": k})])
        return []

    def _sort(self, fired):
        """Incidents first; warnings mark the interval unhealthy."""
        if any(name not in self.triggers for name, _ in fired):
            self.warned = True
        return sorted(fired, key=lambda item: item[0] not in self.triggers)

    def is_incident(self, fired):
        return bool(fired) and fired[0][0] in self.triggers

    def take_healthy_mark(self):
        """True if nothing fired since the last call: the mark for the checkpoint being saved."""
        healthy, self.warned = not self.warned, False
        return healthy

    def state_dict(self):
        return {
            "losses": list(self.losses),
            "grad_norms": list(self.grad_norms),
            "evals": list(self.evals),
            "warned": self.warned,
        }

    def load_state_dict(self, state):
        self.losses = deque(state["losses"], maxlen=self.window)
        self.grad_norms = deque(state["grad_norms"], maxlen=self.window)
        self.evals = [tuple(e) for e in state["evals"]]
        self.warned = state["warned"]


# ----------------------------------------------------------------------------
# The runbook: its choice of rung, and what incidents leave on the LR


RUNGS = {"skip": 1, "lower_lr": 2, "rewarm": 2, "stop": 3}


@dataclass
class Recovery:
    """What incidents (and a resume) have done to the run's LR and step; saved with every checkpoint, so a
    resumed run keeps it. The LR a step trains at is lr_at(schedule_step(step)) * lr_factor(step)."""

    incidents: int = 0
    lr_scale: float = 1.0  # the product of the LR cuts of rung 2 (lower_lr)
    last_incident_step: int = -1  # -1: none yet
    rewarm_from: int = -1  # rung 2 (rewarm): the step from which the LR climbs back; -1: none
    schedule_from: int = 0  # the step the LR schedule counts from: 0, unless --resume_without schedule
    rewarm_iters: int = 0  # the run's setting, not its state: a re-warm's climb (--rewarm_iters, or warmup_iters)

    def state_dict(self):
        return {name: value for name, value in asdict(self).items() if name != "rewarm_iters"}

    def load_state_dict(self, state):
        for name, value in state.items():
            setattr(self, name, value)

    def response(self, step, rcfg):
        """The runbook's response to an incident at `step`, given the incidents before it:
        skip | lower_lr | rewarm | stop."""
        if self.incidents + 1 > rcfg.max_incidents:
            return "stop"
        # after a rollback the step counter goes back, so an incident before the last one is a repeat too
        repeat = (
            rcfg.incident_window > 0
            and self.last_incident_step >= 0
            and step - self.last_incident_step < rcfg.incident_window
        )
        return rcfg.repeat_response if repeat else "skip"

    def schedule_step(self, step):
        """The step the LR schedule reads: counted from schedule_from."""
        return step - self.schedule_from

    def lr_factor(self, step):
        """What the incidents did to the scheduled LR at `step`: their cuts, times a re-warm's climb from 0."""
        factor = self.lr_scale
        if 0 <= self.rewarm_from <= step < self.rewarm_from + self.rewarm_iters:
            factor *= (step - self.rewarm_from + 1) / self.rewarm_iters
        return factor


# ----------------------------------------------------------------------------
# The runbook's actions on a run


@dataclass
class Incidents:
    """A run's incidents: the monitor that detects them, the Recovery that remembers them, the faults planted for
    teaching (faults.py), and the runbook's actions (respond)."""

    monitor: HealthMonitor
    recovery: Recovery
    injector: FaultInjector
    rcfg: RecoveryConfig  # the runbook's settings: its window, its rungs, --max_incidents

    def respond(self, step, fired, checkpointer, reporter):
        """Climb the runbook for the incident `fired` at `step`: roll back with the checkpointer, skip the data
        that led to it, apply the rung to the LR, and log it with the reporter. Returns the step to go on from."""
        detector, values = fired[0]
        response = self.recovery.response(step, self.rcfg)
        incident = {"step": step, "detector": detector, "values": values, "rung": RUNGS[response], "response": response}
        if response == "stop":
            self.stop(incident, checkpointer.folder, reporter)
        stream = checkpointer.data.train_stream
        bad_end = stream.position  # the data up to here led to the incident
        kept = replace(self.recovery, incidents=self.recovery.incidents + 1, last_incident_step=step)
        latest = checkpointer.load(healthy_only=True)
        if latest is None:
            where = checkpointer.folder.ckpt_dir
            raise UserError(f"{detector} at step {step}, and no healthy checkpoint in {where} to roll back to")
        restored = checkpointer.restore(latest[1])
        skipped = [stream.position, bad_end]
        stream.position = bad_end
        if response == "lower_lr":
            kept.lr_scale *= self.rcfg.incident_lr_scale
        elif response == "rewarm":
            kept.rewarm_from = restored
        self.recovery.load_state_dict(kept.state_dict())  # what the incidents did survives the older state's restore
        discarded = checkpointer.discard_after(restored)
        checkpointer.save(restored)  # the restored state, with the skip and the response, so a crash now keeps them
        incident["action"] = {
            "restored_step": restored,
            "skipped_rows": skipped,
            "lr_scale": kept.lr_scale,
            "rewarm_from": kept.rewarm_from,
            "discarded_checkpoints": discarded,
        }
        reporter.rewind(restored)
        reporter.log_incident(incident)
        say(
            f"INCIDENT at step {step}: {detector} {values} -> rung {RUNGS[response]} ({response}): rolled back to "
            f"step {restored}, skipped data rows {skipped[0]}..{skipped[1]}, LR x{kept.lr_scale:.3g}",
            flush=True,
        )
        return restored

    def stop(self, incident, folder, reporter):
        """The runbook's last rung: log the incident and stop every rank, naming what was tried."""
        reporter.log_incident(incident)
        reporter.tracker.close()
        lowered = self.recovery.lr_scale < 1
        tried = "rolling back and skipping data" + (
            f" and an LR lowered to x{self.recovery.lr_scale:.3g}" if lowered else ""
        )
        raise UserError(
            f"stopping after {self.recovery.incidents + 1} incidents (--max_incidents {self.rcfg.max_incidents}); the "
            f"last: {incident['detector']} at step {incident['step']} {incident['values']}. {tried.capitalize()} did "
            "not end them, so suspect something deeper: the data around the skipped rows (in "
            f"{folder.incidents_path}), --dtype, the init. The healthy checkpoints in {folder.ckpt_dir} are intact: "
            "resume from them with a lower --learning_rate or a longer --warmup_iters, or a larger --max_incidents."
        )
