"""A reference band: one recipe trained over K seeds, each with its own data order, summed up per logged step.

    python bench/bands.py --preset shakespeare --seeds 1-10 [--jobs 2] [--runs DIR] [--out FILE] [--overwrite]
                          [-- TRAIN FLAGS]

Seed s runs `python train.py --preset P --seed s --data_order s --out_dir RUNS/seed_s --num_samples 0` (--runs:
default out/bands/P), --jobs at a time on one thread each, its output in RUNS/seed_s.log. A run that finished with
the same configuration is read, not trained again; an interrupted one resumes from its checkpoint; a finished run of
another configuration is refused by name. Flags after `--` go to every run: --url for a corpus held
locally, or a smaller model (the band then belongs to that model: it records the identity its runs share).
bands.make_band sums the runs up (the mean, std and 5/50/95% quantiles of the train and val loss at each logged
step), calibrates the band's edge on them (each seed judged against the band of the others) and records how it was
made. It writes bands/<preset>.json unless --out names another file; an existing file is kept unless --overwrite.
"""

import argparse
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from data import read_json  # noqa: E402
from errors import UserError  # noqa: E402
from machinery.analysis import bands  # noqa: E402
from machinery.components.run_folder import is_finished  # noqa: E402
from machinery.job.config import config_file_form, parse_args  # noqa: E402
from machinery.job.files import write_json_atomic  # noqa: E402


def seed_list(text):
    """--seeds 1-10 or 1,2,5 -> [1, ..., 10] or [1, 2, 5]."""
    try:
        seeds = [s for part in text.split(",") for s in seed_range(*map(int, part.split("-")))]
    except (TypeError, ValueError):
        raise UserError(f"--seeds {text!r}: a range 1-10 or a list 1,2,5 of whole numbers") from None
    if len(set(seeds)) != len(seeds) or min(seeds) < 1:
        raise UserError(f"--seeds {text}: distinct seeds of 1 or more (a data order of 0 is the file's own)")
    return seeds


def seed_range(first, last=None):
    return range(first, (first if last is None else last) + 1)


def train_seed(preset, seed, run_dir, train_flags):
    """Train seed `seed` into run_dir unless it has finished; returns (seed, seconds, what happened)."""
    argv = ["--preset", preset, "--seed", str(seed), "--data_order", str(seed), "--out_dir", run_dir]
    argv += ["--num_samples", "0", *train_flags]
    recorded = read_json(os.path.join(run_dir, "run.json"))
    max_iters = recorded["TrainConfig"]["max_iters"] if recorded else None
    if recorded and is_finished(os.path.join(run_dir, "metrics.jsonl"), max_iters, max_iters):
        # the run's recorded configuration read back as --config reads it (fields added since: their defaults)
        had = config_file_form(*parse_args(["--config", os.path.join(run_dir, "run.json")])[::2])
        wanted = config_file_form(*parse_args(argv)[::2])
        if without_where_from(had) != without_where_from(wanted):
            raise UserError(f"{run_dir} holds a finished run of another configuration: remove it, or choose --runs")
        return seed, 0.0, "finished earlier"
    command = [sys.executable, "train.py", *argv]
    started = time.perf_counter()
    with open(f"{run_dir}.log", "w") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=one_thread())
    if done.returncode != 0:
        raise RuntimeError(f"seed {seed} failed (exit {done.returncode}): see {run_dir}.log")
    return seed, time.perf_counter() - started, "trained"


def without_where_from(config):
    """A recorded configuration without the flags that say where files come from or go (--url, --init_url, --log_to,
    --plot, and --out_dir, however it was spelled): they are not part of a run (run_folder.run_identity leaves them
    out)."""
    where_from = {"data": ("url",), "train": ("init_url", "log_to", "plot", "out_dir")}
    return {
        section: {k: v for k, v in values.items() if k not in where_from.get(section, ())}
        if isinstance(values, dict)
        else values
        for section, values in config.items()
    }


def one_thread():
    """The environment of a run that shares the machine with --jobs - 1 others."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--seeds", default="1-10", help="at least 8 (default 1-10)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--runs", default="", help="the runs' folder (default out/bands/<preset>)")
    parser.add_argument("--out", default="", help="the band file (default bands/<preset>.json)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing band file")
    parser.add_argument("train_flags", nargs="*", help="after --: flags for every run")
    args = parser.parse_args(argv)
    try:
        seeds = seed_list(args.seeds)
    except UserError as e:
        parser.error(str(e))
    if len(seeds) < bands.MIN_SEEDS:
        parser.error(f"--seeds {args.seeds}: a band needs at least {bands.MIN_SEEDS} seeds")
    out = args.out or os.path.join(ROOT, "bands", f"{args.preset}.json")
    if os.path.exists(out) and not args.overwrite:
        parser.error(f"{out} exists: pass --overwrite to replace it, or --out another file")
    runs_dir = os.path.abspath(args.runs or os.path.join(ROOT, "out", "bands", args.preset))  # the same however named
    os.makedirs(runs_dir, exist_ok=True)
    run_dirs = {s: os.path.join(runs_dir, f"seed_{s}") for s in seeds}
    print(f"{len(seeds)} seeds of --preset {args.preset} {' '.join(args.train_flags)} into {runs_dir}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = [pool.submit(train_seed, args.preset, s, run_dirs[s], args.train_flags) for s in seeds]
        for job in jobs:
            try:
                seed, seconds, what = job.result()
            except (RuntimeError, UserError) as e:
                pool.shutdown(cancel_futures=True)  # the seeds not started yet are not trained for nothing
                sys.exit(f"error: {e}")
            print(f"  seed {seed}: {what}" + (f" in {seconds / 60:.1f} min" if seconds else ""), flush=True)
    made_by = {
        "command": " ".join(["python bench/bands.py", *(argv if argv is not None else sys.argv[1:])]),
        "runs": "python train.py --preset P --seed s --data_order s (and the flags after --), one per seed",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    try:
        band = bands.make_band([bands.read_run(run_dirs[s]) for s in seeds], args.preset, made_by)
    except UserError as e:  # a seed that had an incident, or trained another recipe
        sys.exit(f"error: {e}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_json_atomic(out, band)
    rule = band["rule"]
    print(
        f"wrote {out}: {len(seeds)} seeds; edge mean ± {rule['z']:g} x std, out for {rule['persist']} logged points "
        f"in a row ({rule['calibration']})"
    )


if __name__ == "__main__":
    main()
