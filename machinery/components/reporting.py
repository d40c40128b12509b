"""What a run says as it goes (the Reporter): the cost account at its start (closed forms and one measured step), each
logged step (the console, metrics.jsonl, the trackers, throughput and MFU), the state and communication it measures
beside their closed forms, its incidents, and its end (the final check, the metrics plot, samples, and the band to
read the curve against)."""

import math
import os
import sys
import time

import torch
import torch.distributed as dist

from machinery.analysis.bands import find_band
from machinery.components.evaluation import final_check
from machinery.components.run_folder import append_jsonl, read_jsonl, write_jsonl
from machinery.components.sample import sample_texts
from machinery.corpora.corpus import get_tokenizer
from machinery.health.monitor import (
    SavedActivations,
    Throughput,
    peak_memory_bytes,
    plot_gantt,
    plot_metrics,
    state_bytes,
)
from machinery.job.cluster import PREEMPTED, say
from machinery.planning import closed_forms, cost
from parallel.comm_count import take_busiest_comm_bytes
from parallel.pipeline import bubble_fraction

# ----------------------------------------------------------------------------
# The start: what the run will cost


def timed_step_seconds(model, batch, repeats=3):
    """The fastest of a few forward + backward passes (the first one warms up), then drop the
    gradients. sync=False: data parallelism starts no all-reduce for these."""
    x, y = batch
    synchronize = torch.cuda.synchronize if model.device.type == "cuda" else lambda: None  # wait for the GPU
    times = []
    for _ in range(repeats):
        synchronize()
        t0 = time.perf_counter()
        model.forward_backward(x, y, 1.0, sync=False)
        synchronize()
        times.append(time.perf_counter() - t0)
    model.clear_gradients()
    return min(times)


class Reporter:
    """What a run says and logs: the console (rank 0's voice), the logged timeline (records, metrics.jsonl) and
    the trackers --log_to names, incidents.jsonl, throughput and MFU, the state and communication measured beside
    their closed forms, and the end of the run. It reads the model as this rank holds it and the run's data."""

    def __init__(self, job, folder, data, learner, tracker, benchmark_examples, peak_flops):
        self.job, self.folder, self.data, self.learner = job, folder, data, learner
        self.configs, self.grid, self.is_rank0 = job.configs, job.grid, job.is_rank0
        self.tracker = tracker  # --log_to's TensorBoard / W&B on rank 0 (tracking.py); else none
        self.benchmark_examples = benchmark_examples  # for the final check ([]: none)
        self.flops_per_token = closed_forms.flops_per_token(job.configs.model)  # of the whole single-device model
        self.peak_flops = peak_flops  # one device's peak, for MFU; None on CPU
        self.records = []  # logged metrics of the current timeline, for the plot and the trackers
        self.throughput = Throughput(data.tokens_per_step)  # restarted by start_timeline
        self.started = time.perf_counter()
        self.measured_state = None  # monitor.state_bytes at this process's first update, until logged
        self.comm_compared = False  # the first logged step printed its measured bytes beside the closed form

    def print_cost_account(self):
        """What the run will cost (cost.py's account): parameters, tokens, FLOPs, memory, and the time from
        one measured step."""
        cfg, model = self.configs.train, self.learner.model  # rank 0's: the first stage, which keeps the most
        say(f"device {model.device}, dtype {str(self.job.dtype).replace('torch.', '')}, out {self.folder.out_dir}")
        batch = [t.to(model.device) for t in next(iter(self.data.val_streams.values())).next_batch()]
        step_seconds = timed_step_seconds(model, batch) * cfg.gradient_accumulation_steps
        with SavedActivations(model.module) as saved:  # one more pass, to weigh what backward keeps
            model.forward_backward(*batch, 1.0, sync=False)
        model.clear_gradients()
        for line in cost.account_lines(
            self.configs.model,
            self.configs.parallel,
            cfg.batch_size // model.micro_batches,
            model.in_flight,
            cfg.max_iters,
            self.data.tokens_per_step,
            self.job.dtype.itemsize,
            step_seconds,
            measured_activations=saved.peak,
        ):
            say("cost: " + line)

    def start_timeline(self, step):
        """The logged timeline that led to `step` (metrics.jsonl cut there), the state measured at the first update,
        and the throughput clock started: the loop's first step is next."""
        self.records = read_jsonl(self.folder.metrics_path)
        self.rewind(step)
        self.measure_state_at_the_first_update()
        self.throughput = Throughput(self.data.tokens_per_step)

    def rewind(self, step):
        """The logged timeline cut back to the steps before `step` (a resume, a rollback), on disk too."""
        self.records = [r for r in self.records if r["step"] < step]
        if self.is_rank0:
            write_jsonl(self.folder.metrics_path, self.records)

    # ------------------------------------------------------------------------
    # Each logged step

    def log(self, record):
        """One line on the console, one record in metrics.jsonl and in the trackers --log_to names (tracking.py)."""
        step = record["step"]
        tokens_per_s, seconds_per_step = self.throughput.read()
        record["tokens_per_s"] = tokens_per_s
        line = (
            f"step {step:5d} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | grad norm {record['grad_norm']:.3f}"
        )
        line += f" | {tokens_per_s:,.0f} tok/s"
        if self.peak_flops:
            # tokens/s counts the whole group and FLOPs the whole model; each of the group's devices has this peak
            record["mfu"] = self.flops_per_token * tokens_per_s / (self.peak_flops * self.grid.world_size)
            line += f" | MFU {100 * record['mfu']:.1f}%"
        line += f" | ETA {(self.configs.train.max_iters - step - 1) * seconds_per_step / 60:.1f} min"
        if "val_loss" in record:
            line += f" | val loss {record['val_loss']:.4f}"
        if "skipped" in record:
            line += f" | step skipped: {record['skipped']}"
        if step == 0 and not self.configs.train.init_from:
            vocab = self.data.meta["vocab_size"]
            line += f"\n  a fresh model guesses uniformly: loss ~ ln(vocab) = ln {vocab} = {math.log(vocab):.4f}"
        if self.grid.world_size > 1:  # the step's communication, each dimension on its busiest rank
            record.update({f"comm_bytes_{d}": b for d, b in take_busiest_comm_bytes(self.learner.model.device).items()})
        say(line, flush=True)
        if self.measured_state is not None:
            self.print_state_beside_closed_form(record)
        if self.grid.world_size > 1 and not self.comm_compared:
            self.print_comm_beside_closed_form(record)
        self.records.append(record)
        if self.is_rank0:
            append_jsonl(self.folder.metrics_path, record)
            self.tracker.log(self.records)  # the timeline: a tracker drops what a resume or rollback dropped

    def warn(self, step, fired):
        """The detectors that fired at `step` without calling for a rollback (the monitor marks the next checkpoint
        unhealthy): one line each."""
        for detector, values in fired:
            say(f"warning at step {step}: {detector} {values}; the next checkpoint is marked unhealthy")

    def log_incident(self, incident):
        """An incident into incidents.jsonl and the trackers (rank 0)."""
        if self.is_rank0:
            append_jsonl(self.folder.incidents_path, incident)
            self.tracker.incident(incident)

    def measure_state_at_the_first_update(self):
        """measured_state: monitor.state_bytes once, just after the first update, when the weights, their
        gradients and AdamW's moments all exist (log prints it beside its closed form (closed_forms.py))."""
        module, optimizer = self.learner.model.module, self.learner.optimizer

        def measure(optimizer, args, kwargs):
            self.measured_state = state_bytes(module, optimizer)
            hook.remove()

        hook = optimizer.register_step_post_hook(measure)

    def print_state_beside_closed_form(self, record):
        """The state bytes of the first update, on the fullest rank, beside its closed form (closed_forms.py)."""
        layout = self.configs.parallel
        measured = torch.tensor(self.measured_state, dtype=torch.int64, device=self.learner.model.device)
        if dist.is_initialized():
            dist.all_reduce(measured, op=dist.ReduceOp.MAX)
        record["state_bytes"] = measured.item()
        closed_form = closed_forms.fullest_rank_state_bytes(self.configs.model, layout)
        say(
            f"state at the first update, on the fullest rank: measured {record['state_bytes']:,} B | closed form "
            f"{closed_form:,.0f} B = {closed_forms.state_bytes_formula(layout.dp, layout.zero_stage)} per parameter "
            "held"
        )
        self.measured_state = None

    def print_comm_beside_closed_form(self, record):
        """The first logged step's communication, each dimension on its busiest rank, beside its closed form."""
        cfg = self.configs.train
        expected = closed_forms.busiest_stage_comm_bytes(
            self.configs.model,
            self.configs.parallel,
            batch_size=cfg.batch_size,
            accumulation=cfg.gradient_accumulation_steps,
            compute_bytes=self.job.dtype.itemsize,
        )  # {dimension: (bytes, formula)}
        say("communication of that step, payload bytes on the busiest rank: measured | closed form")
        for d, (closed_form, formula) in expected.items():
            say(f"  {d} {record[f'comm_bytes_{d}']:>13,} | {closed_form:>13,} = {formula}")
        self.comm_compared = True

    # ------------------------------------------------------------------------
    # The end

    def finish(self, final_evaluation):
        """The end of a run: its peak memory, the layout's own account, the final check of the last weights (judged
        in final_evaluation, validate's record), the metrics plot, samples; where a band of its recipe over seeds
        exists (bands/<preset>.json), how to read the curve against it."""
        model, out_dir = self.learner.model, self.folder.out_dir
        peak = peak_memory_bytes(model.device)  # set against the cost account's memory line at the start
        say(
            f"training took {(time.perf_counter() - self.started) / 60:.1f} min"
            + (f"; peak memory {peak / 2**30:.2f} GiB" if peak else "")
        )
        timeline = model.timeline()  # a pipeline's, gathered before rank 0 scores the benchmark alone
        if timeline is not None and self.is_rank0:
            self.print_pipeline_bubble(timeline)
        record, single = final_check(
            model,
            self.configs.train.max_iters,
            final_evaluation["val_loss"],
            self.configs.model,
            self.data.meta,
            self.benchmark_examples,
        )
        if not self.is_rank0:
            return
        record = {**final_evaluation, **record}  # a mix's val_loss_by_source and mix_tokens beside the final check's
        self.records.append(record)
        append_jsonl(self.folder.metrics_path, record)
        self.tracker.log(self.records)
        self.tracker.close()
        plot = self.configs.train.plot
        if plot:
            plot_metrics(
                self.records,
                read_jsonl(self.folder.incidents_path),
                os.path.join(out_dir, "metrics.png"),
                math.log(self.data.meta["vocab_size"]),
            )
        samples = sample_texts(single, get_tokenizer(self.data.meta["tokenizer"]), self.configs.sample, model.device)
        with open(os.path.join(out_dir, "samples.txt"), "w") as f:
            f.write("\n\n==========\n\n".join(samples) + "\n")
        shown = f"samples:\n{samples[0]}\n" if samples else ""  # --num_samples 0: none
        figures = ["metrics.png", *(["pipeline.png"] if timeline is not None else [])] if plot else []
        written = ["metrics.jsonl", *figures, "samples.txt", "ckpt/"]
        print(f"{shown}wrote {out_dir}: {', '.join(written)}")
        band, _ = find_band(self.folder.identity, self.job.preset)
        if band:  # a band of this recipe over seeds (bands/<preset>.json): the reader sets the run against it
            seeds = len(band["seeds"])
            print(f"is this curve normal? Against {seeds} seeds of its recipe: python -m machinery.curves {out_dir}")

    def print_pipeline_bubble(self, timeline):
        """The last training step as the pipeline ran it: the measured bubble beside the formula, and its Gantt
        chart."""
        layout = self.configs.parallel
        p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
        schedule = layout.schedule if v == 1 else f"interleaved {layout.schedule}, v={v}"
        measured = bubble_fraction(timeline)
        formula = "(p - 1) / (m + p - 1)" if v == 1 else "(p - 1) / (v * m + p - 1)"  # computed as written
        say(
            f"pipeline bubble of the last step: measured {measured:.3f}, {formula} = "
            f"{closed_forms.computed(formula, p=p, m=m, v=v):.3f} ({schedule}, p={p}, m={m})"
        )
        if self.configs.train.plot:
            title = f"{schedule}, p={p}, m={m}: bubble {measured:.2f}"
            plot_gantt(timeline, os.path.join(self.folder.out_dir, "pipeline.png"), title)

    def stop_for_signal(self, step):
        """A stop signal reached the job and the checkpoint of `step` is written: end every rank with
        cluster.PREEMPTED, which a scheduler's script (examples/slurm/train.sbatch) reads as "requeue me"."""
        received = self.job.watch.signals.received or "a stop signal to another rank"
        say(
            f"{received}: stopped after step {step - 1} and wrote the checkpoint of step {step} in "
            f"{self.folder.ckpt_dir}. Run the same command to resume from it (exit code {PREEMPTED})",
            flush=True,
        )
        self.tracker.close()
        sys.exit(PREEMPTED)
