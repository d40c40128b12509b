"""The incident runbook's rungs, and the choice among them: which response an incident gets, given the
incidents before it. incidents.respond_to_incident carries the response out (roll back, skip, change the LR);
the state here (Recovery) is saved with every checkpoint.

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

from dataclasses import dataclass


@dataclass
class Recovery:
    """What incidents (and a resume) have done to the run's LR and step; saved with every
    checkpoint, so a resumed run keeps it."""

    incidents: int = 0
    lr_scale: float = 1.0  # the product of the LR cuts of rung 2 (lower_lr)
    last_incident_step: int = -1  # -1: none yet
    rewarm_from: int = -1  # rung 2 (rewarm): the step from which the LR climbs back; -1: none
    schedule_from: int = 0  # the step the LR schedule counts from: 0, unless --resume_without schedule


RUNGS = {"skip": 1, "lower_lr": 2, "rewarm": 2, "stop": 3}


def runbook_response(recovery, step, rcfg):
    """The response to an incident at `step`, given the incidents before it: skip | lower_lr | rewarm | stop."""
    if recovery.incidents + 1 > rcfg.max_incidents:
        return "stop"
    # after a rollback the step counter goes back, so an incident before the last one is a repeat too
    repeat = (
        rcfg.incident_window > 0
        and recovery.last_incident_step >= 0
        and step - recovery.last_incident_step < rcfg.incident_window
    )
    return rcfg.repeat_response if repeat else "skip"
