"""A run's set-up: everything before its first step, built into one `Run` the loop and the machinery share.

Processes and devices (the process grid, the compute dtype), the data (one source, or a mix: mixture.py), the
run's folder (run_folder.py), the model cut for this rank's place in the layout (a fresh init, or --init_from's
weights: init_from.py), AdamW, the loss scaler, the health monitor and the fault injector. The Run's hooks are all
the loop asks of the machinery after set-up.
"""

import contextlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from data import TokenStream
from errors import UserError
from machinery import closed_forms, evaluation, incidents, planner, reporting, resume
from machinery.arms import check_arms
from machinery.cluster import Watch, check_visible_everywhere, end_with_launcher, run_on_rank0
from machinery.config import Configs, config_file_form
from machinery.corpus import DataConfig, default_data_dir, get_tokenizer, load_or_prepare
from machinery.evaluation import read_benchmark
from machinery.faults import FaultInjector
from machinery.incidents import HealthMonitor, Recovery
from machinery.init_from import InitialWeights, initial_model
from machinery.mixture import Mix, MixedStream, mix_meta, prepare_sources, read_mix
from machinery.monitor import Throughput
from machinery.run_folder import (
    check_out_dir_is_ours,
    identity_defaults,
    out_dir_of,
    prepare_out_dir,
    run_identity,
)
from machinery.torch_engines import rank_model
from machinery.tracking import Tracker, hyperparameters, trackers_asked
from machinery.transfer import fetch_named_base, is_named_base
from parallel.grid import ProcessGrid, init_distributed, launch_from_environment
from parallel.layout import RankModel, check_layout
from parallel.optimizer import adamw

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
    return getattr(dp, "optimizer", adamw)(groups, **options)  # ZeRO's engine has one; any other rank takes adamw


# ----------------------------------------------------------------------------
# The run


@dataclass
class Run:
    """What the loop and the machinery's stages share. set_up builds it; afterwards the stages change only
    `recovery`, `records`, `comm_compared`, `measured_state`, `initial_weights` and `throughput` (resume.start,
    restore_checkpoint, respond_to_incident, log_step, the first update), while the objects it holds (model,
    optimizer, streams, monitor, tracker) change state as they work.

    Beyond the model, optimizer, scaler, monitor and recovery it holds, the loop (train.train) asks a run only
    these hooks, each a line here over the machinery's modules:

        start()                         resume from the newest checkpoint, or step 0: the first step (resume.py)
        batches(step)                   the next_batch the step reads: the data's, or a fault's (faults.py)
        validate(step)                  {"val_loss": ...} of the weights now, the throughput clock paused
        respond_to_incident(step, fired)  the runbook's rung acted on: the step to go on from (incidents.py)
        log(record)                     one logged step: console, metrics.jsonl, trackers (reporting.py)
        save(step)                      a checkpoint of the state the step starts from (resume.py)
        stop_for_signal(step)           after a stop signal's checkpoint: end every rank, exit code 75
        finish(final_evaluation)        the final check, the plot, samples (reporting.py)
    """

    preset: str  # --preset's name: its band of seeds, if any, reads the curve at the end
    command: dict  # this command's settings in config-file form (run.json's "config": --config OUT/run.json repeats it)
    configs: Configs  # the model's with the vocabulary padded
    grid: ProcessGrid
    say: Callable[..., None]  # print on rank 0, silence elsewhere: one voice for the whole group
    out_dir: str
    identity: dict  # what makes two runs the same run (run.json)
    continued: list[str]  # the schedule fields that differ from the run already in out_dir ("max_iters: 2000 -> 3000")
    # --init_from's weights, fitted to this run, for start() to load if it starts at step 0 (then dropped); None:
    # a fresh init, or a run that resumes from its own checkpoints (the source was not read: it may be gone)
    initial_weights: InitialWeights | None
    meta: dict  # the token files' meta.json; for a mix, the sources' together (mixture.mix_meta)
    mix: Mix | None  # --mix: the sources and their weights by step; None: one source
    benchmark_examples: list[dict]  # for the final check ([]: none); read at set-up, so a failed download fails early
    train_stream: TokenStream | MixedStream
    val_streams: dict[str, TokenStream]  # by source name; one source: one stream
    eval_batches: int  # micro-batches per evaluation of each val stream, on each rank
    model: RankModel  # the model as this rank holds it
    optimizer_groups: list[
        list[str]
    ]  # the single-device names of each AdamW group's parameters: how checkpoints list them
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # fp16 loss scaling; disabled for fp32 and bf16
    dtype: torch.dtype
    monitor: HealthMonitor
    recovery: Recovery  # what incidents did to the LR and step (incidents.py)
    injector: FaultInjector
    tokens_per_step: int  # all ranks together
    flops_per_token: float  # of the whole single-device model, whatever share this rank holds
    peak_flops: float | None  # one device's peak, for MFU; None on CPU
    watch: Watch  # stop signals, heartbeats and the run folder's lock (cluster.py), until the job ends
    tracker: Tracker = field(default_factory=Tracker)  # --log_to's TensorBoard / W&B on rank 0 (tracking.py); else none
    comm_compared: bool = False  # the first logged step printed its measured bytes beside the closed form
    measured_state: int | None = None  # monitor.state_bytes at this process's first update, until logged
    records: list[dict] = field(default_factory=list)  # logged metrics of the current timeline, for the plot
    started: float = field(default_factory=time.perf_counter)
    throughput: Throughput | None = None  # tokens/s of the steps since start(), evaluations left out

    @property
    def is_rank0(self):
        return self.grid.rank == 0

    @property
    def ckpt_dir(self):
        return os.path.join(self.out_dir, "ckpt")

    @property
    def ckpt_dirs(self):
        """Where its checkpoints are kept: ckpt_dir, and --ckpt_mirror's second copy if given."""
        mirror = self.configs.recovery.ckpt_mirror
        return [self.ckpt_dir] + ([os.path.join(mirror, "ckpt")] if mirror else [])

    @property
    def metrics_path(self):
        return os.path.join(self.out_dir, "metrics.jsonl")

    @property
    def incidents_path(self):
        return os.path.join(self.out_dir, "incidents.jsonl")

    # The hooks train.train's loop calls

    def start(self):
        return resume.start(self)

    def batches(self, step):
        return self.injector.strike(step, self.model, self.train_stream)  # the data, unless a fault is due

    def validate(self, step):
        with self.throughput.paused():
            return evaluation.validate(self, step)  # val_loss; for a mix, each source's too, and the tokens read

    def respond_to_incident(self, step, fired):
        return incidents.respond_to_incident(self, step, fired)

    def log(self, record):
        reporting.log_step(self, record)

    def save(self, step):
        resume.save_checkpoint(self, step)

    def stop_for_signal(self, step):
        reporting.stop_for_signal(self, step)

    def finish(self, final_evaluation):
        reporting.finish(self, final_evaluation)


def start_processes(configs):
    """This process's place in the group, its voice, device and compute dtype: (grid, say, device, dtype)."""
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
    say = print if grid.rank == 0 else (lambda *args, **kwargs: None)
    # every generator a checkpoint saves, so that two runs of one command save the same states
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return grid, say, device, dtype


def set_up(preset, configs):
    """Everything before the first step: processes, data, the run's folder, model, optimizer, watchers."""
    cfg, recovery = configs.train, configs.recovery
    command = config_file_form(preset, configs)  # as given, before the run fills in the model's vocabulary
    grid, say, device, dtype = start_processes(configs)
    trackers = run_on_rank0(lambda: trackers_asked(cfg.log_to), grid.rank == 0)  # rank 0 logs: it needs the packages
    out_dir = out_dir_of(preset, cfg)
    run_on_rank0(lambda: check_out_dir_is_ours(out_dir), grid.rank == 0)  # before the data may land inside it
    run_on_rank0(lambda: check_a_corpus_is_named(preset, configs), grid.rank == 0)
    watch = Watch(out_dir, grid, say)  # the folder's lock first: one job per run folder (cluster.py)
    with contextlib.ExitStack() as on_failure:  # a set-up that fails releases the lock
        on_failure.callback(watch.close)
        if is_named_base(cfg.init_from):  # before the data: a Llama base's tokenizer.json comes with it
            run_on_rank0(lambda: fetch_named_base(cfg.init_from, cfg.init_url, say), grid.rank == 0)
        mix, meta, data_dirs = prepare_data(preset, configs, grid.rank == 0)
        benchmark_examples = run_on_rank0(lambda: read_benchmark(configs.benchmark), grid.rank == 0)
        run_on_rank0(lambda: check_tokenizer_at_hand(configs, meta), grid.rank == 0)
        configs, whole, initial_weights = initial_model(configs, meta, grid, say, device, out_dir)
        global_batch = grid.dp * cfg.batch_size * cfg.gradient_accumulation_steps  # sequences per optimizer step
        identity = run_identity(configs.model, cfg, meta, global_batch)
        defaults = identity_defaults(configs.model, cfg)
        continued = run_on_rank0(lambda: prepare_out_dir(out_dir, identity, cfg.overwrite, defaults), grid.rank == 0)
        if recovery.ckpt_mirror:  # a run folder of its own, so another run's copies are never taken for this one's
            mirror = recovery.ckpt_mirror
            run_on_rank0(lambda: prepare_mirror(mirror, identity, cfg.overwrite, defaults), grid.rank == 0)
        check_visible_everywhere(
            [os.path.join(d, "meta.json") for d in data_dirs.values()] + [os.path.join(out_dir, "run.json")]
        )
        say(f"{grid}" if grid.world_size > 1 else "single process")
        train_stream, val_streams, eval_batches = open_token_streams(
            mix, data_dirs, meta, cfg, configs.model.block_size, grid, say
        )
        # the single-device names of each AdamW group's parameters, taken before a layout cuts the model
        optimizer_groups = [[name for name, _ in group] for group in parameter_groups(whole.named_parameters())]
        model = rank_model(
            whole, grid, configs.parallel, cfg.batch_size, dtype, autocast_context(device, dtype), cfg.compile
        )
        run = Run(
            preset=preset,
            command=command,
            configs=configs,
            grid=grid,
            say=say,
            out_dir=out_dir,
            identity=identity,
            continued=continued,
            initial_weights=initial_weights,
            meta=meta,
            mix=mix,
            benchmark_examples=benchmark_examples,
            train_stream=train_stream,
            val_streams=val_streams,
            eval_batches=eval_batches,
            model=model,
            optimizer_groups=optimizer_groups,
            optimizer=make_optimizer(model.module, cfg, device, model.dp),
            scaler=torch.amp.GradScaler(device.type, enabled=dtype == torch.float16),
            dtype=dtype,
            monitor=HealthMonitor(
                recovery.monitor_window,
                recovery.spike_factor,
                recovery.grad_z_threshold,
                recovery.val_rise_evals,
                recovery.triggers.split(","),
            ),
            # faults strike one process, the last rank, as a failing machine would
            recovery=Recovery(rewarm_iters=recovery.rewarm_iters or cfg.warmup_iters),
            injector=FaultInjector(
                recovery.inject, out_dir, meta["vocab_size"], grid.rank, grid.rank == grid.world_size - 1
            ),
            tokens_per_step=global_batch * configs.model.block_size,
            flops_per_token=closed_forms.flops_per_token(configs.model),
            peak_flops=planner.device_peak_flops(device, cfg.peak_tflops),
            tracker=Tracker(trackers if grid.rank == 0 else (), out_dir, hyperparameters(configs, identity)),
            watch=watch,
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


def check_a_corpus_is_named(preset, configs):
    """Refuse, before the run writes anything, to train on data nobody named: a --data_dir without token files that
    only the embedded default (stdlib) would fill, or a preset that names no corpus (gpt2-small) with none prepared."""
    cfg, dcfg = configs.train, configs.data
    default_dir = default_data_dir(dcfg)
    data_dir = cfg.data_dir or default_dir
    if cfg.mix or dcfg.source not in ("", DataConfig.source) or os.path.exists(os.path.join(data_dir, "meta.json")):
        return
    prepare = f"python -m machinery.corpus --source 'texts/**/*.txt' --tokenizer {dcfg.tokenizer} --out_dir"
    if cfg.data_dir and os.path.abspath(data_dir) != os.path.abspath(default_dir):
        named = f"the embedded default, {dcfg.source}, fills only its own folder ({default_dir})" if dcfg.source else ""
        raise UserError(
            f"--data_dir {cfg.data_dir} holds no token files (no meta.json), and the run names no corpus to prepare "
            f"there{': ' + named if named else ''}. Prepare yours once: {prepare} {cfg.data_dir} (or pass --source)"
        )
    if not dcfg.source:
        raise UserError(
            f"--preset {preset} names no corpus: its plan of {cfg.max_iters:,} steps needs data you choose, not a "
            f"default that would silently stand in for it. Prepare yours once, e.g. {prepare} data/texts, then pass "
            "--data_dir data/texts (or --source, or --mix)"
        )


def prepare_data(preset, configs, is_rank0):
    """(the mix or None, meta, {source name: its data folder}): the token files, tokenized by rank 0 on first use.
    A mix prepares each of its sources into a folder of its own, data/<source>-<tokenizer> (under --data_dir if
    given), so a source shared by several mixes is tokenized once."""
    cfg, dcfg = configs.train, configs.data
    if cfg.mix:
        mix = read_mix(cfg.mix)
        prepared = run_on_rank0(lambda: prepare_sources(mix, dcfg, cfg.data_dir or "data"), is_rank0)
        data_dirs = {name: data_dir for name, (data_dir, _) in prepared.items()}
        return mix, mix_meta(mix, {name: meta for name, (_, meta) in prepared.items()}), data_dirs
    data_dir = cfg.data_dir or default_data_dir(dcfg)
    meta = run_on_rank0(lambda: load_or_prepare(dcfg, data_dir), is_rank0)
    return None, meta, {"data": data_dir}


def open_token_streams(mix, data_dirs, meta, cfg, block_size, grid, say):
    """(train stream, {source: val stream}, micro-batches per evaluation on each rank), announced. Each DP
    rank reads its share of every batch; --data_order shuffles the training data only, so every run is
    judged on the same val rows. A mix reads its sources' train files through one MixedStream."""

    def stream(data_dir, split, order_seed=0):
        return TokenStream(
            os.path.join(data_dir, f"{split}.bin"),
            meta["dtype"],
            cfg.batch_size,
            block_size,
            grid.dp_rank,
            grid.dp,
            cfg.lanes,
            order_seed,
        )

    for name, data_dir in data_dirs.items():
        source_meta = meta["sources"][name] if mix else meta
        say(
            f"data {data_dir}: {source_meta['source']}, {meta['tokenizer']} tokens, "
            f"{source_meta['train_tokens']:,} train + {source_meta['val_tokens']:,} val"
            + (f"; starting weight {mix.weights[name]:.3g}" if mix else "")
        )
    train_streams = {name: stream(data_dir, "train", cfg.data_order) for name, data_dir in data_dirs.items()}
    val_streams = {name: stream(data_dir, "val") for name, data_dir in data_dirs.items()}
    if mix:
        train_stream = MixedStream(
            mix, train_streams, cfg.batch_size, grid.dp_rank, grid.dp, cfg.gradient_accumulation_steps
        )
    else:
        (train_stream,) = train_streams.values()
    # an eval reads eval_iters global batches (fewer if a val.bin is smaller), in this rank's micro-batches
    global_batch = grid.dp * cfg.batch_size * cfg.gradient_accumulation_steps
    smallest = min(s.windows_per_epoch for s in val_streams.values())
    eval_iters = max(1, min(cfg.eval_iters, smallest // global_batch))
    return train_stream, val_streams, eval_iters * cfg.gradient_accumulation_steps
