"""Experiment trackers (--log_to tensorboard,wandb): what a run logs into metrics.jsonl and incidents.jsonl, sent on
to TensorBoard and/or Weights & Biases by rank 0, with the run's configuration as hyperparameters.

    python train.py --log_to tensorboard && tensorboard --logdir out/tiny    # event files in out/tiny/tensorboard/
    python train.py --log_to wandb     # offline unless W&B is set up; then: wandb sync out/tiny/wandb/offline-run-*

Every record goes by its step: its numbers as scalars (loss, lr, grad_norm, val_loss, tokens_per_s, mfu, comm_bytes_*,
state_bytes, ...; a nested dict as "val_loss_by_source/code"), its strings as text. Both packages are optional:
imported only when asked for, and one that is missing is named at start-up with the command that installs it.

A tracker follows metrics.jsonl's timeline. A resume or a rollback drops the records from the step the run goes back
to; TensorBoard shows the same, as it keeps, per tag, only the points before a step that comes again (its default
loader by itself; the older Python one reads the SessionLog START written there, what torch's
SummaryWriter(purge_step=...) writes). W&B has no such rule: its charts (against our step) keep both, the line
stepping back at a rollback. Incidents go to TensorBoard as a run of their own, tensorboard/incidents; one at a step no
later than an earlier one's (a repeat after a rollback) replaces it there, while incidents.jsonl keeps them all.
"""

import difflib
import json
import netrc
import os
from dataclasses import asdict
from urllib.parse import urlsplit

from errors import UserError

TRACKERS = ("tensorboard", "wandb")  # the names --log_to takes; each needs the pip package of the same name


def trackers_asked(log_to):
    """The trackers --log_to names ("tensorboard,wandb" -> ("tensorboard", "wandb")), each imported once to be sure
    it can be: a UserError names an unknown one, or the package a known one lacks and how to install it."""
    names = tuple(dict.fromkeys(name.strip() for name in log_to.split(",") if name.strip()))
    for name in names:
        if name not in TRACKERS:
            close = difflib.get_close_matches(name, TRACKERS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UserError(f"--log_to {name!r}: {hint}choose tensorboard, wandb, or both: --log_to tensorboard,wandb")
        try:
            import_tensorboard() if name == "tensorboard" else import_wandb()
        except ImportError as e:
            raise UserError(
                f"--log_to {name} needs the {name} package: pip install {name} (the import said: {e})"
            ) from None
    return names


def import_tensorboard():
    from torch.utils.tensorboard import SummaryWriter  # torch's writer; it needs the tensorboard package

    return SummaryWriter


def import_wandb():
    import wandb

    return wandb


def hyperparameters(configs, identity):
    """The run's configuration as the trackers take it: every config field by concern (model, data, train, parallel,
    recovery, ...) and, under "identity", run.json's identity (the global batch, the data's tokenizer and sha256)."""
    return {**asdict(configs), "identity": identity}


class Tracker:
    """The trackers of this process. Rank 0 holds those --log_to names; every other rank (and a run without
    --log_to) holds none, and every call does nothing. They open at the first record or incident, so a command
    refused at start-up (a finished run) leaves nothing in them."""

    def __init__(self, names=(), out_dir="", config=None):
        self.names, self.out_dir, self.config = names, out_dir, config or {}
        self.backends = None  # opened when first needed
        self.last_step = None  # the step of the last record sent

    def log(self, timeline):
        """Send the newest record of the run's timeline (the reporter's records, just appended to). If the record
        before it is not the last one sent, the timeline was cut since (this process started, resumed, or rolled
        back): the trackers drop what they had from the step after it on, as metrics.jsonl did."""
        if not self.names:
            return
        record = timeline[-1]
        kept = timeline[-2]["step"] if len(timeline) > 1 else -1  # the record this one follows; -1: none
        if kept != self.last_step:
            for backend in self.open():
                backend.cut(kept + 1)
        scalars, texts = scalars_and_texts(record)
        for backend in self.open():
            backend.record(record["step"], scalars, texts)
        self.last_step = record["step"]

    def incident(self, incident):
        """An incident, as incidents.jsonl holds it: as text and as a marker (its rung) at its step."""
        if not self.names:
            return
        for backend in self.open():
            backend.incident(incident)

    def close(self):
        for backend in self.backends or []:
            backend.close()
        self.backends, self.last_step = None, None

    def open(self):
        if self.backends is None:
            kinds = {"tensorboard": TensorBoard, "wandb": WeightsAndBiases}
            self.backends = [kinds[name](self.out_dir, self.config) for name in self.names]
        return self.backends


def scalars_and_texts(record):
    """({tag: number}, {tag: text}) of a metrics record, without its step: nested dicts flattened to "outer/inner",
    numbers as scalars, anything else (a skipped step's reason) as text."""
    scalars, texts = {}, {}
    for tag, value in flatten(record).items():
        if tag == "step":
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scalars[tag] = value
        else:
            texts[tag] = value if isinstance(value, str) else json.dumps(value)
    return scalars, texts


def flatten(tree, prefix=""):
    """{"val_loss_by_source": {"code": 1.2}} -> {"val_loss_by_source/code": 1.2}"""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def describe(incident):
    """An incident in one line, as the run prints it, and whole, as incidents.jsonl holds it."""
    return (
        f"{incident['detector']} at step {incident['step']} -> rung {incident['rung']} ({incident['response']})\n\n"
        f"```\n{json.dumps(incident, indent=1)}\n```"
    )


class TensorBoard:
    """Event files in out_dir/tensorboard/metrics (the records, the configuration) and out_dir/tensorboard/incidents
    (a run of its own, never cut), through torch's SummaryWriter, flushed after every write: a run killed at any
    moment has sent TensorBoard what metrics.jsonl holds. A resumed run adds an event file beside the old ones."""

    def __init__(self, out_dir, config):
        self.folder, self.config = os.path.join(out_dir, "tensorboard"), config
        self.metrics = import_tensorboard()(os.path.join(self.folder, "metrics"))
        self.incidents = None  # opened at the first incident

    def cut(self, step):
        """Hide the events of `step` and later sent so far (TensorBoard's reader drops them when it meets the START),
        then send the configuration again, in case the cut hid it."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from torch.utils.tensorboard.summary import hparams

        self.metrics.file_writer.add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
        hparam_values = {
            tag: value if isinstance(value, (int, float, str, bool)) else json.dumps(value)
            for tag, value in flatten(self.config).items()
        }
        for summary in hparams(hparam_values, {"loss": None, "val_loss": None}):  # the HPARAMS tab, beside these two
            self.metrics.file_writer.add_summary(summary, step)
        self.metrics.add_text("config", f"```\n{json.dumps(self.config, indent=1)}\n```", step)
        self.metrics.flush()

    def record(self, step, scalars, texts):
        for tag, value in scalars.items():
            self.metrics.add_scalar(tag, value, step)
        for tag, text in texts.items():
            self.metrics.add_text(tag, text, step)
        self.metrics.flush()

    def incident(self, incident):
        if self.incidents is None:
            self.incidents = import_tensorboard()(os.path.join(self.folder, "incidents"))
        self.incidents.add_text("incident", describe(incident), incident["step"])
        self.incidents.add_scalar("incident/rung", incident["rung"], incident["step"])
        self.incidents.flush()

    def close(self):
        self.metrics.close()
        if self.incidents is not None:
            self.incidents.close()


class WeightsAndBiases:
    """One W&B run per process (a resumed run is another W&B run of the same name and group), its files in
    out_dir/wandb. Logged against our step as its own metric, not W&B's step, which must only grow: a rollback
    steps back. Offline unless W&B is set up (wandb_mode); an offline run is uploaded later with
    `wandb sync out_dir/wandb/offline-run-*`."""

    def __init__(self, out_dir, config):
        wandb = import_wandb()
        name = os.path.basename(os.path.normpath(out_dir))
        # W&B's own variables, read here as the wandb package would: its project, and its mode (wandb_mode)
        project = os.environ.get("WANDB_PROJECT") or "minipretrain"
        self.wandb_run = wandb.init(
            project=project, name=name, group=name, dir=out_dir, config=config, mode=wandb_mode()
        )
        self.wandb_run.define_metric("step")
        self.wandb_run.define_metric("*", step_metric="step")

    def cut(self, step):
        pass  # W&B keeps what it was sent; the charts show the line step back

    def record(self, step, scalars, texts):
        self.wandb_run.log({"step": step, **scalars, **texts})

    def incident(self, incident):
        self.wandb_run.log(
            {"step": incident["step"], "incident/rung": incident["rung"], "incident": describe(incident)}
        )

    def close(self):
        self.wandb_run.finish()


def wandb_mode():
    """WANDB_MODE when set (online, offline, disabled); else online where an API key is configured (WANDB_API_KEY, or
    `wandb login`'s entry in ~/.netrc), and offline elsewhere, so that a run never stops to ask for a login."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    try:
        found = netrc.netrc(os.environ.get("NETRC")).authenticators(host)  # only whether there is one
    except (OSError, netrc.NetrcParseError):
        found = None
    return "online" if found else "offline"
