"""Runs compared checkpoint by checkpoint on one fixed evaluation: the chapter's fourth intuition, trust checkpoints
judged on the same rows at equal steps, not a feeling.

    python -m machinery.compare RUN RUN... [--band FILE] [--plot FILE]   # a table by step, RUN/compare.png, a verdict

Each run's checkpoints at the steps they all hold are evaluated with --eval_only's functions (evaluation.evaluate on
the val rows the first run's own evaluations read, and its benchmark where it has one); the verdict reads the last
third of those steps against the seed noise of the band of their recipe (curves.py). It writes nothing but its plot.
"""

import argparse
import contextlib
import math
import os
import statistics
import sys
from dataclasses import replace

import numpy as np

from data import load_meta
from errors import UserError
from machinery.analysis.bands import find_band, read_run, recipe
from machinery.components import checkpoint
from machinery.components.evaluation import benchmark_scores, evaluate, read_benchmark
from machinery.components.run_data import open_token_streams
from machinery.components.run_folder import recorded_gpt_config
from machinery.components.run_setup import pick_device
from machinery.components.sample import single_device_model
from machinery.corpora.corpus import default_data_dir, get_tokenizer
from machinery.job.cluster import say
from machinery.job.config import BenchmarkConfig, DataConfig, TrainConfig
from parallel.grid import Layout, ProcessGrid
from parallel.layout import model_for_rank


def fixed_evaluation(logged):
    """(val stream, batches, tokenizer, benchmark examples) of the run's own evaluations, on one process: the val
    rows they read, and its benchmark where it has one (--benchmark; [] for none)."""
    if logged.config.get("train", {}).get("mix"):
        raise UserError(
            f"{logged.folder} trained on a --mix: compare reads one source's val rows; put a run of one first"
        )
    train_cfg = TrainConfig(
        **{k: v for k, v in logged.config["train"].items() if k in TrainConfig.__dataclass_fields__}
    )
    data_dir = train_cfg.data_dir or default_data_dir(DataConfig(**logged.config["data"]))
    if not os.path.exists(os.path.join(data_dir, "meta.json")):
        raise UserError(f"{logged.folder} read its data from {data_dir}, which holds no meta.json here")
    meta = load_meta(data_dir)
    block_size = logged.identity["GPTConfig"]["block_size"]
    # one process reading the run's global batch in its micro-batches: the rows of any layout's evaluations
    micro_batch = logged.settings["global_batch"] // train_cfg.gradient_accumulation_steps
    one_process = replace(train_cfg, batch_size=micro_batch)
    grid = ProcessGrid()
    _, streams, batches = open_token_streams(None, {"val": data_dir}, meta, one_process, block_size, grid)
    examples = read_benchmark(BenchmarkConfig(**logged.config.get("benchmark", {})))
    return streams["val"], batches, get_tokenizer(meta["tokenizer"]), examples


def evaluate_checkpoints(logged, steps, evaluation, device):
    """{step: {"val_loss": ..., and "acc_norm" where there is a benchmark}} of the run's checkpoints at `steps`."""
    stream, batches, tokenizer, examples = evaluation
    grid = ProcessGrid()
    results = {}
    for step in steps:
        _, state = checkpoint.load_chosen(os.path.join(logged.folder, "ckpt"), step, device)
        model = single_device_model(recorded_gpt_config(state["config"]), state["model"], device)
        results[step] = {"val_loss": evaluate(model_for_rank(model, grid, Layout(), batches), stream, batches)}
        if examples:
            scores = benchmark_scores(model, tokenizer, examples, device, contextlib.nullcontext())
            results[step]["acc_norm"] = scores["acc_norm"]
    return results


def steps_to_compare(held):
    """The checkpoint steps the runs share ({run folder: its checkpoint steps}), or a UserError naming the steps
    each holds where a verdict on them would judge nothing (step 0 alone: models before any training) or the early
    curve (no shared step in the last third of the longer run, counted from its step 0)."""
    steps = sorted(set.intersection(*map(set, held.values())))
    holds = "; ".join(f"{name} holds {steps_named(sorted(s))}" for name, s in held.items())
    if not steps:
        raise UserError(f"the runs share no checkpoint step: {holds}")
    if steps == [0]:
        raise UserError(f"the runs share only step 0, before any training: nothing to compare ({holds})")
    longer = max(held, key=lambda name: max(held[name]))
    if steps[-1] < 2 * max(held[longer]) / 3:
        raise UserError(
            f"the runs share checkpoint steps up to {steps[-1]} only, before the last third of {longer}'s "
            f"{max(held[longer])} steps, where its curve has settled; a verdict there would judge early wiggles "
            f"({holds}). Compare runs that reach the same steps, or go on with the shorter one (--max_iters)"
        )
    return steps


def compare_runs(run_dirs, band_path="", device="cpu"):
    """(results {run: {step: {"val_loss", "acc_norm"?}}}, verdict line) of runs' checkpoints at the steps they
    share, on the first run's evaluation (its val rows, its benchmark). The verdict reads the val loss over the last
    third of those steps: the mean gap there between the best run and the next, against the band's seed noise of a
    difference, √2 x its val std there."""
    runs = [read_run(d) for d in run_dirs]
    first = recipe(runs[0].identity)
    for logged in runs[1:]:
        mine = recipe(logged.identity)
        if (mine["data"], mine["model"]["block_size"]) != (first["data"], first["model"]["block_size"]):
            raise UserError(
                f"{logged.folder} and {runs[0].folder} trained on other data or blocks: one evaluation cannot judge "
                "both"
            )
    steps = steps_to_compare(
        {logged.folder: checkpoint.list_steps(os.path.join(logged.folder, "ckpt")) for logged in runs}
    )
    evaluation = fixed_evaluation(runs[0])
    say(f"{len(steps)} shared checkpoint steps, each evaluated on {runs[0].folder}'s {evaluation[1]} val batches")
    results = {logged.folder: evaluate_checkpoints(logged, steps, evaluation, device) for logged in runs}
    last_third = [t for t in steps if t >= steps[0] + 2 * (steps[-1] - steps[0]) / 3]
    late = {name: statistics.fmean(by_step[t]["val_loss"] for t in last_third) for name, by_step in results.items()}
    ranked = sorted(late, key=late.get)
    gap = late[ranked[1]] - late[ranked[0]]
    band, why = find_band(runs[0].identity, runs[0].preset, band_path)
    if band is None:
        return results, f"verdict: no band for these runs: {why}; lowest over the last third: {ranked[0]} by {gap:.4f}"
    val = band["val"]
    noise = math.sqrt(2) * statistics.fmean(np.interp(last_third, val["step"], val["std"]))
    if gap > 2 * noise:
        return results, f"verdict: {ranked[0]} ahead by {gap:.4f} (noise {noise:.4f})"
    return results, f"verdict: tied within noise (gap {gap:.4f}, noise {noise:.4f}; ahead needs twice the noise)"


def steps_named(steps):
    """'steps 0, 100, 200' or, for many, 'steps 0, 100, 200, ..., 1800, 1900, 2000 (21 in all)'."""
    if len(steps) <= 8:
        return "steps " + ", ".join(map(str, steps))
    return f"steps {', '.join(map(str, steps[:3]))}, ..., {', '.join(map(str, steps[-3:]))} ({len(steps)} in all)"


def plot_comparison(results, path):
    """Each run's val loss (and benchmark) by checkpoint step."""
    from matplotlib.figure import Figure

    has_benchmark = any("acc_norm" in r for by_step in results.values() for r in by_step.values())
    fig = Figure(figsize=(12 if has_benchmark else 8, 4))
    axes = fig.subplots(1, 2 if has_benchmark else 1, squeeze=False)[0]
    for name, by_step in results.items():
        axes[0].plot(list(by_step), [r["val_loss"] for r in by_step.values()], "o-", ms=4, label=name)
        if has_benchmark:
            axes[1].plot(list(by_step), [r["acc_norm"] for r in by_step.values()], "o-", ms=4, label=name)
    axes[0].set(xlabel="checkpoint step", ylabel="val loss (one fixed evaluation)", title="checkpoints compared")
    axes[0].legend(fontsize=8)
    if has_benchmark:
        axes[1].set(xlabel="checkpoint step", ylabel="HellaSwag acc_norm", title="the benchmark")
    fig.savefig(path, dpi=100)


def print_comparison(results):
    """The table by step: each run's val loss, and its benchmark where there is one."""
    steps = list(next(iter(results.values())))
    width = max(len(name) for name in results) + 10
    print(f"{'step':<{width}}  " + "  ".join(f"{t:>8}" for t in steps))
    for metric in ("val_loss", "acc_norm"):
        for name, by_step in results.items():
            if metric in by_step[steps[0]]:
                print(f"{name + ' ' + metric:<{width}}  " + "  ".join(f"{by_step[t][metric]:8.4f}" for t in steps))


# ----------------------------------------------------------------------------
# Command line


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m machinery.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="two run folders (out_dir) or more")
    parser.add_argument("--band", default="", help="a band file (default: bands/<the first run's preset>.json)")
    parser.add_argument("--plot", default="", help="where the plot goes (default: RUN/compare.png of the first)")
    parser.add_argument("--device", default="cpu", help="where checkpoints are evaluated")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if len(args.runs) < 2:
        parser.error("compare needs two run folders or more")
    try:
        results, verdict = compare_runs(args.runs, args.band, pick_device(args.device))
        print_comparison(results)
        plot_comparison(results, args.plot or os.path.join(args.runs[0], "compare.png"))
    except UserError as e:
        sys.exit(f"error: {e}")
    print(verdict)


if __name__ == "__main__":
    main()
