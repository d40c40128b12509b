"""What a run says as it goes: the cost account at its start (closed forms and one measured step), each
logged step (the console, metrics.jsonl, the trackers), the state and communication it measures beside their closed
forms, and its end (the final check, the metrics plot, samples, and the band to read the curve against)."""

import math
import os
import sys
import time

import torch
import torch.distributed as dist

from machinery import closed_forms, cost
from machinery.bands import find_band
from machinery.cluster import PREEMPTED
from machinery.corpus import get_tokenizer
from machinery.evaluation import final_check
from machinery.monitor import SavedActivations, peak_memory_bytes, plot_gantt, plot_metrics, state_bytes
from machinery.run_folder import append_jsonl, read_jsonl
from machinery.sample import sample_texts
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


def print_cost_account(run):
    """What the run will cost (cost.py's account): parameters, tokens, FLOPs, memory, and the time from
    one measured step."""
    cfg, model = run.configs.train, run.model  # rank 0's model: the first stage, which keeps the most activations
    run.say(f"device {model.device}, dtype {str(run.dtype).replace('torch.', '')}, out {run.out_dir}")
    batch = [t.to(model.device) for t in next(iter(run.val_streams.values())).next_batch()]
    step_seconds = timed_step_seconds(model, batch) * cfg.gradient_accumulation_steps
    with SavedActivations(model.module) as saved:  # one more pass, to weigh what backward keeps
        model.forward_backward(*batch, 1.0, sync=False)
    model.clear_gradients()
    for line in cost.account_lines(
        run.configs.model,
        run.configs.parallel,
        cfg.batch_size // model.micro_batches,
        model.in_flight,
        cfg.max_iters,
        run.tokens_per_step,
        run.dtype.itemsize,
        step_seconds,
        measured_activations=saved.peak,
    ):
        run.say("cost: " + line)


# ----------------------------------------------------------------------------
# Each logged step


def log_step(run, record):
    """One line on the console, one record in metrics.jsonl and in the trackers --log_to names (tracking.py)."""
    step = record["step"]
    tokens_per_s, seconds_per_step = run.throughput.read()
    record["tokens_per_s"] = tokens_per_s
    line = f"step {step:5d} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | grad norm {record['grad_norm']:.3f}"
    line += f" | {tokens_per_s:,.0f} tok/s"
    if run.peak_flops:
        # tokens/s counts the whole group and FLOPs the whole model; each of the group's devices has this peak
        record["mfu"] = run.flops_per_token * tokens_per_s / (run.peak_flops * run.grid.world_size)
        line += f" | MFU {100 * record['mfu']:.1f}%"
    line += f" | ETA {(run.configs.train.max_iters - step - 1) * seconds_per_step / 60:.1f} min"
    if "val_loss" in record:
        line += f" | val loss {record['val_loss']:.4f}"
    if "skipped" in record:
        line += f" | step skipped: {record['skipped']}"
    if step == 0 and not run.configs.train.init_from:
        vocab = run.meta["vocab_size"]
        line += f"\n  a fresh model guesses uniformly: loss ~ ln(vocab) = ln {vocab} = {math.log(vocab):.4f}"
    if run.grid.world_size > 1:  # the step's communication, each dimension on its busiest rank
        record.update({f"comm_bytes_{d}": b for d, b in take_busiest_comm_bytes(run.model.device).items()})
    run.say(line, flush=True)
    if run.measured_state is not None:
        print_state_beside_closed_form(run, record)
    if run.grid.world_size > 1 and not run.comm_compared:
        print_comm_beside_closed_form(run, record)
    run.records.append(record)
    if run.is_rank0:
        append_jsonl(run.metrics_path, record)
        run.tracker.log(run.records)  # the timeline: a tracker drops what a resume or rollback dropped


def measure_state_at_the_first_update(run):
    """run.measured_state: monitor.state_bytes once, just after the first update, when the weights, their
    gradients and AdamW's moments all exist (log_step prints it beside its closed form (closed_forms.py))."""

    def measure(optimizer, args, kwargs):
        run.measured_state = state_bytes(run.model.module, optimizer)
        hook.remove()

    hook = run.optimizer.register_step_post_hook(measure)


def print_state_beside_closed_form(run, record):
    """The state bytes of the first update, on the fullest rank, beside its closed form (closed_forms.py)."""
    layout = run.configs.parallel
    measured = torch.tensor(run.measured_state, dtype=torch.int64, device=run.model.device)
    if dist.is_initialized():
        dist.all_reduce(measured, op=dist.ReduceOp.MAX)
    record["state_bytes"] = measured.item()
    closed_form = closed_forms.fullest_rank_state_bytes(run.configs.model, layout)
    run.say(
        f"state at the first update, on the fullest rank: measured {record['state_bytes']:,} B | closed form "
        f"{closed_form:,.0f} B = {closed_forms.state_bytes_formula(layout.dp, layout.zero_stage)} per parameter held"
    )
    run.measured_state = None


def print_comm_beside_closed_form(run, record):
    """The first logged step's communication, each dimension on its busiest rank, beside its closed form."""
    cfg = run.configs.train
    expected = closed_forms.busiest_stage_comm_bytes(
        run.configs.model,
        run.configs.parallel,
        batch_size=cfg.batch_size,
        accumulation=cfg.gradient_accumulation_steps,
        compute_bytes=run.dtype.itemsize,
    )  # {dimension: (bytes, formula)}
    run.say("communication of that step, payload bytes on the busiest rank: measured | closed form")
    for d, (closed_form, formula) in expected.items():
        run.say(f"  {d} {record[f'comm_bytes_{d}']:>13,} | {closed_form:>13,} = {formula}")
    run.comm_compared = True


# ----------------------------------------------------------------------------
# The end


def finish(run, final_evaluation):
    """The end of a run: its peak memory, the layout's own account, the final check of the last weights (judged
    in final_evaluation, validate's record), the metrics plot, samples; where a band of its recipe over seeds
    exists (bands/<preset>.json), how to read the curve against it."""
    peak = peak_memory_bytes(run.model.device)  # set against the cost account's memory line at the start
    run.say(
        f"training took {(time.perf_counter() - run.started) / 60:.1f} min"
        + (f"; peak memory {peak / 2**30:.2f} GiB" if peak else "")
    )
    timeline = run.model.timeline()  # a pipeline's, gathered before rank 0 scores the benchmark alone
    if timeline is not None and run.is_rank0:
        print_pipeline_bubble(run, timeline)
    record, model = final_check(
        run.model,
        run.grid,
        run.configs.train.max_iters,
        final_evaluation["val_loss"],
        run.configs.model,
        run.meta,
        run.benchmark_examples,
        run.say,
    )
    if not run.is_rank0:
        return
    record = {**final_evaluation, **record}  # a mix's val_loss_by_source and mix_tokens beside the final check's
    run.records.append(record)
    append_jsonl(run.metrics_path, record)
    run.tracker.log(run.records)
    run.tracker.close()
    if run.configs.train.plot:
        plot_metrics(
            run.records,
            read_jsonl(run.incidents_path),
            os.path.join(run.out_dir, "metrics.png"),
            math.log(run.meta["vocab_size"]),
        )
    samples = sample_texts(model, get_tokenizer(run.meta["tokenizer"]), run.configs.sample, run.model.device)
    with open(os.path.join(run.out_dir, "samples.txt"), "w") as f:
        f.write("\n\n==========\n\n".join(samples) + "\n")
    shown = f"samples:\n{samples[0]}\n" if samples else ""  # --num_samples 0: none
    figures = ["metrics.png", *(["pipeline.png"] if timeline is not None else [])] if run.configs.train.plot else []
    written = ["metrics.jsonl", *figures, "samples.txt", "ckpt/"]
    print(f"{shown}wrote {run.out_dir}: {', '.join(written)}")
    band, _ = find_band(run.identity, run.preset)
    if band:  # a band of this recipe over seeds (bands/<preset>.json): the reader sets the run against it
        seeds = len(band["seeds"])
        print(f"is this curve normal? Against {seeds} seeds of its recipe: python -m machinery.curves {run.out_dir}")


def print_pipeline_bubble(run, timeline):
    """The last training step as the pipeline ran it: the measured bubble beside the formula, and its Gantt chart."""
    layout = run.configs.parallel
    p, m, v = layout.pp, layout.micro_batches, layout.virtual_stages
    schedule = layout.schedule if v == 1 else f"interleaved {layout.schedule}, v={v}"
    measured = bubble_fraction(timeline)
    formula = "(p - 1) / (m + p - 1)" if v == 1 else "(p - 1) / (v * m + p - 1)"  # computed as written
    run.say(
        f"pipeline bubble of the last step: measured {measured:.3f}, {formula} = "
        f"{closed_forms.computed(formula, p=p, m=m, v=v):.3f} ({schedule}, p={p}, m={m})"
    )
    if run.configs.train.plot:
        title = f"{schedule}, p={p}, m={m}: bubble {measured:.2f}"
        plot_gantt(timeline, os.path.join(run.out_dir, "pipeline.png"), title)


def stop_for_signal(run, step):
    """A stop signal reached the job and the checkpoint of `step` is written: end every rank with cluster.PREEMPTED,
    which a scheduler's script (examples/slurm/train.sbatch) reads as "requeue me"."""
    received = run.watch.signals.received or "a stop signal to another rank"
    run.say(
        f"{received}: stopped after step {step - 1} and wrote the checkpoint of step {step} in {run.ckpt_dir}. Run "
        f"the same command to resume from it (exit code {PREEMPTED})",
        flush=True,
    )
    run.tracker.close()
    sys.exit(PREEMPTED)
