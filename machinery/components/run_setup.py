"""A run's set-up: everything before its first step, built into one `Run` of a few components that own their state.

The job (the process grid, the compute dtype, the watch), the run's folder (run_folder.py), the data (one source,
or a mix: run_data.py), the learner (the model cut for this rank's place in the layout from a fresh init or
--init_from's weights (init_from.py), AdamW, the loss scaler), the incidents (the health monitor, the runbook's
Recovery, the fault injector: incidents.py), the checkpointer (checkpointer.py) and the reporter (reporting.py).
"""

import contextlib
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from errors import UserError
from machinery.components import checkpoint
from machinery.components.checkpointer import Checkpointer
from machinery.components.evaluation import final_check, read_benchmark
from machinery.components.init_from import InitialWeights, initial_model, load_initial_weights
from machinery.components.reporting import Reporter
from machinery.components.run_data import RunData, check_a_corpus_is_named, open_token_streams, prepare_data
from machinery.components.run_folder import (
    RunFolder,
    append_jsonl,
    check_out_dir_is_ours,
    identity_defaults,
    is_finished,
    out_dir_of,
    prepare_out_dir,
    read_jsonl,
    record_config,
    record_identity,
    run_identity,
)
from machinery.components.tracking import Tracker, hyperparameters, trackers_asked
from machinery.corpora.corpus import get_tokenizer
from machinery.health.faults import FaultInjector
from machinery.health.incidents import HealthMonitor, Incidents, Recovery
from machinery.interchange.transfer import fetch_named_base, is_named_base
from machinery.job.arms import check_arms
from machinery.job.cluster import Watch, check_visible_everywhere, end_with_launcher, say
from machinery.job.config import Configs, config_file_form
from machinery.job.torch_engines import rank_model
from machinery.planning import planner
from parallel.grid import ProcessGrid, init_distributed, launch_from_environment
from parallel.layout import RankModel, check_layout
from parallel.optimizer import adamw
from parallel.zero import ZeroStage

# ----------------------------------------------------------------------------
# Device, precision, optimizer


def pick_device(name):
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def pick_dtype(name, device):
    """Mixed precision: the forward/backward matmuls run in 16 bits under autocast, the
    weights and AdamW state stay fp32 ("master weights"). bf16 keeps fp32's exponent
    range, so unlike fp16 it needs no loss scaling."""
    if name == "auto" and device.type == "cuda":
        with torch.cuda.device(device):  # this rank's GPU, asked before the process group selects it
            name = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    elif name == "auto":
        name = "bfloat16" if device.type == "cpu" and cpu_has_native_bf16() else "float32"
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise UserError(f"--dtype {name!r}: choose auto, {', '.join(dtypes)}")
    return dtypes[name]


def cpu_has_native_bf16():  # AVX512-BF16 or AMX run bf16 matmuls in hardware; elsewhere bf16 is emulated, slower
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def autocast_context(device, dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def parameter_groups(named_parameters):
    """AdamW's two groups as [(name, parameter)] lists: matrices and embeddings, which weight
    decay pulls toward zero, and norm gains and biases, which it leaves alone."""
    named = list(named_parameters)
    return [(n, p) for n, p in named if p.dim() >= 2], [(n, p) for n, p in named if p.dim() < 2]


def make_optimizer(module, cfg, device, dp=None):
    """AdamW over the module's parameters in parameter_groups' two groups. dp: the DP engine of the model as this
    rank holds it (RankModel.dp): ZeRO's builds it, as it knows what this rank updates (its pieces)."""
    decay, no_decay = parameter_groups(module.named_parameters())
    groups = [([p for _, p in decay], cfg.weight_decay), ([p for _, p in no_decay], 0.0)]
    fused = device.type in ("cuda", "cpu")  # one kernel updates every tensor; the moments stay fp32
    options = dict(lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), fused=fused)
    return dp.optimizer(groups, **options) if isinstance(dp, ZeroStage) else adamw(groups, **options)


# ----------------------------------------------------------------------------
# The run: a few components, each owning its state


@dataclass
class Job:
    """What was asked and where it runs: the preset, the configs (the model's with the vocabulary padded) and this
    command's settings in config-file form (run.json's "config": --config OUT/run.json repeats it); this process's
    place in the group and its compute dtype; and the watch: stop
    signals, heartbeats and the run folder's lock (cluster.py), until the job ends."""

    preset: str  # --preset's name: its band of seeds, if any, reads the curve at the end
    configs: Configs
    command: dict
    grid: ProcessGrid
    dtype: torch.dtype
    watch: Watch

    @property
    def is_rank0(self):
        return self.grid.rank == 0


@dataclass
class Learner:
    """What an update changes: the model as this rank holds it, its optimizer and the fp16 loss scaler (disabled
    for fp32 and bf16). optimizer_groups: the single-device names of each optimizer group's parameters, how a
    checkpoint lists them. initial_weights: --init_from's, fitted to this run, for the start at step 0 (then
    dropped); None: a fresh init, or a run that resumes from its own checkpoints (the source was not read)."""

    model: RankModel
    optimizer: torch.optim.Optimizer
    optimizer_groups: list[list[str]]
    scaler: torch.amp.GradScaler
    initial_weights: InitialWeights | None = None


@dataclass
class Run:
    """A run as the loop (train.train) sees it: its components, each owning its state, and the few steps of a run
    that take several of them. The loop reads the learner's model, optimizer and scaler, the incidents' monitor
    and recovery, and calls:

        start()                           resume from the newest checkpoint, or step 0: the first step
        batches(step)                     the next_batch the step reads: the data's, or a fault's (faults.py)
        validate(step)                    {"val_loss": ...} of the weights now, the throughput clock paused
        respond_to_incident(step, fired)  the runbook's rung acted on: the step to go on from (incidents.py)
    and, of its components:

        run.reporter.log(record)               one logged step: console, metrics.jsonl, trackers (reporting.py)
        run.checkpointer.save(step)            a checkpoint of the state the step starts from (checkpointer.py)
        run.reporter.stop_for_signal(step)     after a stop signal's checkpoint: end every rank, exit code 75
        run.reporter.finish(final_evaluation)  the final check, the plot, samples (reporting.py)
    """

    job: Job
    folder: RunFolder
    data: RunData
    learner: Learner
    incidents: Incidents
    checkpointer: Checkpointer
    reporter: Reporter

    def start(self):
        """The run's first moments: refuse a finished run, print the cost account, then resume from the newest
        checkpoint that verifies, or start at step 0 (from --init_from's weights, if given) and save it; record
        this command's settings and its dtype in run.json, and start the reporter's timeline and clock. Returns
        the first step."""
        job, folder, cfg, rcfg = self.job, self.folder, self.job.configs.train, self.job.configs.recovery
        self.data.check_epochs(cfg)
        latest = self.checkpointer.load()
        if latest is not None:
            newest, state = latest
            if job.grid.on_rank0(lambda: is_finished(folder.metrics_path, newest, cfg.max_iters)):
                refuse_finished_run(folder.out_dir, newest, cfg)
        if folder.continued:
            say(f"continuing the run in {folder.out_dir} with {'; '.join(folder.continued)}")
            job.grid.on_rank0(lambda: record_identity(folder.out_dir, folder.identity))
        # the measured step runs before the RNG is restored or first saved, so every start draws alike
        self.reporter.print_cost_account()
        if latest is not None:
            step = self.checkpointer.restore(state, forget=rcfg.forgotten_on_resume)
            say(f"resuming from the checkpoint of step {step} in {folder.ckpt_dir}")
        elif rcfg.resume:
            raise UserError(f"--resume, but {folder.ckpt_dir} holds no checkpoint that verifies")
        else:
            step = 0
            if cfg.init_from:
                learner = self.learner
                load_initial_weights(learner.model, learner.initial_weights, job, self.data.meta, folder.identity)
                learner.initial_weights = None  # the model holds them now
            self.checkpointer.save(0)
        # run.json's "config": this command's settings, which `--config OUT/run.json` repeats; and its dtype
        dtype = str(job.dtype).removeprefix("torch.")
        job.grid.on_rank0(lambda: record_config(folder.out_dir, job.command, step, dtype))
        self.reporter.start_timeline(step)
        return step

    def batches(self, step):
        """The next_batch the step reads: the data's, unless a fault is due (faults.py)."""
        return self.incidents.injector.strike(step, self.learner.model, self.data.train_stream)

    def validate(self, step):
        """{"val_loss": ...} of the weights now (for a mix, each source's too, and the tokens read), off the clock."""
        with self.reporter.throughput.paused():
            return self.data.validate(self.learner.model, step)

    def respond_to_incident(self, step, fired):
        """The runbook's rung for the incident `fired` at `step`, acted on; returns the step to go on from."""
        return self.incidents.respond(step, fired, self.checkpointer, self.reporter)

    def evaluate_newest(self):
        """--eval_only: the final check of the newest checkpoint (or --ckpt_step's), logged to metrics.jsonl."""
        job, folder = self.job, self.folder
        latest = self.checkpointer.load(ckpt_step=job.configs.recovery.ckpt_step)
        if latest is None:
            raise UserError(f"--eval_only: no checkpoint in {folder.ckpt_dir} verifies")
        step, state = latest
        checkpoint.load_full_state_dict(self.learner.model, state["model"])
        record, _ = final_check(
            self.learner.model,
            step,
            self.validate(step)["val_loss"],
            job.configs.model,
            self.data.meta,
            self.reporter.benchmark_examples,
            eval_only=True,
        )
        if job.is_rank0:
            append_jsonl(folder.metrics_path, record)
            self.reporter.tracker.log(read_jsonl(folder.metrics_path))  # the timeline this record now ends
            self.reporter.tracker.close()


def refuse_finished_run(out_dir, finished_at, cfg):
    hint = f"; --lr_decay_iters {finished_at} keeps it at min_lr instead" if not cfg.lr_decay_iters else ""
    raise UserError(
        f"{out_dir} holds a finished run: its newest checkpoint is at step {finished_at} and --max_iters is "
        f"{cfg.max_iters}, so there is nothing to train. To train it further, pass a larger --max_iters "
        f"(the LR schedule stretches to the new end{hint}); to start over there, --overwrite; or choose "
        f"another --out_dir. To sample from it: python train.py --sample --out_dir {out_dir}"
    )


def start_processes(configs):
    """This process's place in the group, its device and compute dtype: (grid, device, dtype)."""
    cfg, layout = configs.train, configs.parallel
    launch = launch_from_environment()
    device = pick_device(cfg.device if cfg.device != "auto" else launch.device)
    dtype = pick_dtype(cfg.dtype, device)
    # before any process group exists: a collective would wait forever for a peer that refused
    check_layout(layout, configs.model, cfg.batch_size, launch.world_size, dtype)
    check_arms(configs.model, layout)
    init_distributed(layout.dist_timeout, launch)
    if launch.torchrun:
        end_with_launcher(launch.rank)  # an orphan would train on beside the next job in its folder (cluster.py)
    grid = ProcessGrid(layout, launch.rank, launch.world_size)
    # every generator a checkpoint saves, so that two runs of one command save the same states
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return grid, device, dtype


def set_up(preset, configs):
    """Everything before the first step: processes, data, the run's folder, model, optimizer, watchers."""
    cfg, recovery = configs.train, configs.recovery
    command = config_file_form(preset, configs)  # as given, before the run fills in the model's vocabulary
    grid, device, dtype = start_processes(configs)
    trackers = grid.on_rank0(lambda: trackers_asked(cfg.log_to))  # rank 0 logs: it needs the packages
    out_dir = out_dir_of(preset, cfg)
    grid.on_rank0(lambda: check_out_dir_is_ours(out_dir))  # before the data may land inside it
    grid.on_rank0(lambda: check_a_corpus_is_named(preset, configs))
    watch = Watch(out_dir, grid)  # the folder's lock first: one job per run folder (cluster.py)
    with contextlib.ExitStack() as on_failure:  # a set-up that fails releases the lock
        on_failure.callback(watch.close)
        if is_named_base(cfg.init_from):  # before the data: a Llama base's tokenizer.json comes with it
            grid.on_rank0(lambda: fetch_named_base(cfg.init_from, cfg.init_url))
        mix, meta, data_dirs = prepare_data(preset, configs, grid)
        benchmark_examples = grid.on_rank0(lambda: read_benchmark(configs.benchmark))
        grid.on_rank0(lambda: check_tokenizer_at_hand(configs, meta))
        configs, whole, initial_weights = initial_model(configs, meta, grid, device, out_dir)
        global_batch = grid.dp * cfg.batch_size * cfg.gradient_accumulation_steps  # sequences per optimizer step
        identity = run_identity(configs.model, cfg, meta, global_batch)
        defaults = identity_defaults(configs.model, cfg)
        continued = grid.on_rank0(lambda: prepare_out_dir(out_dir, identity, cfg.overwrite, defaults))
        if recovery.ckpt_mirror:  # a run folder of its own, so another run's copies are never taken for this one's
            mirror = recovery.ckpt_mirror
            grid.on_rank0(lambda: prepare_mirror(mirror, identity, cfg.overwrite, defaults))
        check_visible_everywhere(
            [os.path.join(d, "meta.json") for d in data_dirs.values()] + [os.path.join(out_dir, "run.json")]
        )
        say(f"{grid}" if grid.world_size > 1 else "single process")
        train_stream, val_streams, eval_batches = open_token_streams(
            mix, data_dirs, meta, cfg, configs.model.block_size, grid
        )
        # the single-device names of each AdamW group's parameters, taken before a layout cuts the model
        optimizer_groups = [[name for name, _ in group] for group in parameter_groups(whole.named_parameters())]
        model = rank_model(
            whole, grid, configs.parallel, cfg.batch_size, dtype, autocast_context(device, dtype), cfg.compile
        )
        job = Job(preset, configs, command, grid, dtype, watch)
        folder = RunFolder(out_dir, identity, continued, recovery.ckpt_mirror)
        tokens_per_step = global_batch * configs.model.block_size
        data = RunData(meta, mix, train_stream, val_streams, eval_batches, tokens_per_step)
        optimizer = make_optimizer(model.module, cfg, device, model.dp)
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        learner = Learner(model, optimizer, optimizer_groups, scaler, initial_weights)
        monitor = HealthMonitor(
            recovery.monitor_window,
            recovery.spike_factor,
            recovery.grad_z_threshold,
            recovery.val_rise_evals,
            recovery.triggers.split(","),
        )
        # faults strike one process, the last rank, as a failing machine would
        last_rank = grid.rank == grid.world_size - 1
        injector = FaultInjector(recovery.inject, out_dir, meta["vocab_size"], grid.rank, last_rank)
        incidents = Incidents(
            monitor, Recovery(rewarm_iters=recovery.rewarm_iters or cfg.warmup_iters), injector, recovery
        )
        tracker = Tracker(trackers if grid.rank == 0 else (), out_dir, hyperparameters(configs, identity))
        peak_flops = planner.device_peak_flops(device, cfg.peak_tflops)
        run = Run(
            job=job,
            folder=folder,
            data=data,
            learner=learner,
            incidents=incidents,
            checkpointer=Checkpointer(job, folder, learner, data, incidents),
            reporter=Reporter(job, folder, data, learner, tracker, benchmark_examples, peak_flops),
        )
        on_failure.pop_all()
        return run


def check_tokenizer_at_hand(configs, meta):
    """The end of a run decodes its samples and tokenizes the benchmark with the data's tokenizer, which the token
    files do not need: a machine without it (offline, tiktoken's files not cached) finds out now, not after the
    last step."""
    uses = []
    if configs.sample.num_samples:
        uses.append(f"writes {configs.sample.num_samples} samples (--num_samples 0: none)")
    if configs.benchmark.benchmark:
        uses.append(f"scores --benchmark {configs.benchmark.benchmark}")
    if not uses:
        return
    try:
        get_tokenizer(meta["tokenizer"])
    except UserError as e:
        raise UserError(f"at its end this run {' and '.join(uses)} with its data's tokenizer: {e}") from None


def prepare_mirror(mirror, identity, overwrite, defaults):
    check_out_dir_is_ours(mirror, "--ckpt_mirror")
    prepare_out_dir(mirror, identity, overwrite, defaults, "--ckpt_mirror")
