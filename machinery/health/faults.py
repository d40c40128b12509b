"""Fault injection: the incidents of a real run, on demand, for teaching and tests.

    python train.py --inject nan@1000 --out_dir out/nan       # a NaN weight, as from a flipped bit
    python train.py --inject spike@1000 --out_dir out/spike   # one batch of garbage, as from a corrupt shard
    python train.py --inject crash@500 --out_dir out/crash    # SIGKILL; run the same command again to resume
    python train.py --inject hang@500 --dp 2 --dist_timeout 30 ...   # a rank that stops responding, alive

The health monitor (incidents.py) must catch the first two and the runbook
(incidents.Incidents.respond) recover from them; the third is what checkpoints
and exact resume are for; the fourth is what the heartbeats (cluster.py) name.
"""

import json
import os
import signal
import time

import torch

from errors import UserError
from machinery.job.files import write_json_atomic


class FaultInjector:
    """--inject nan@S,spike@S,crash@S,hang@S. Each fault fires once, ever: fired faults are
    remembered in out_dir/injected.json, so a resumed run does not crash again.

    - nan: one weight becomes NaN before step S (a flipped bit); every loss after is NaN.
    - spike: step S trains on garbage instead of its batch (see garbage_batches).
    - crash: the process kills itself before step S (a dying machine).
    - hang: the process sleeps forever before step S, alive but silent (stuck I/O, a wedged device); the
      others wait for it in their next collective until --dist_timeout.
    """

    KINDS = ("nan", "spike", "crash", "hang")

    def __init__(self, spec, out_dir, vocab_size, rank=0, active=True):
        self.vocab_size, self.rank = vocab_size, rank
        self.active = active  # every rank checks the spec; only the active one fires
        self.path = os.path.join(out_dir, "injected.json")
        self.planned = []
        for item in filter(None, spec.split(",")):
            kind, _, at = item.partition("@")
            if kind not in self.KINDS or not at.isdigit():
                raise UserError(f"--inject {item!r}: write KIND@STEP with KIND one of {', '.join(self.KINDS)}")
            self.planned.append(f"{kind}@{int(at)}")
        self.fired = []
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.fired = json.load(f)

    def due(self, step):
        """Faults planned for this step that have not fired yet; they count as fired from now on."""
        if not self.active:
            return []
        due = [f for f in self.planned if f.endswith(f"@{step}") and f not in self.fired]
        if due:
            self.fired += due
            write_json_atomic(self.path, self.fired)
        return [f.split("@")[0] for f in due]

    def strike(self, step, model, stream):
        """Fire the faults due at this step; returns the step's next_batch (garbage for a spike)."""
        next_batch = stream.next_batch
        for fault in self.due(step):
            print(f"rank {self.rank}: injecting fault: {fault} at step {step}", flush=True)
            if fault == "crash":  # Windows has no SIGKILL; its SIGTERM ends a process as abruptly
                os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))
            elif fault == "hang":
                while True:
                    time.sleep(3600)
            elif fault == "nan":
                with torch.no_grad():
                    weight = next(model.module.parameters())  # under --dp_mode fsdp a DTensor: its local shard
                    (weight.to_local() if hasattr(weight, "to_local") else weight).view(-1)[0] = float("nan")
            elif fault == "spike":
                next_batch = garbage_batches(stream, self.vocab_size, seed=step)
            else:
                raise ValueError(f"unknown fault {fault!r}")
        return next_batch


def garbage_batches(stream, vocab_size, seed):
    """next_batch() for a spike: it consumes the real batch (the data position moves on as
    usual) but returns random tokens, inputs and targets, as a corrupt shard would."""
    generator = torch.Generator().manual_seed(seed)

    def next_batch():
        x, _ = stream.next_batch()
        return tuple(torch.randint(vocab_size, x.shape, generator=generator) for _ in range(2))

    return next_batch
