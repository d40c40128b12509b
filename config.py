"""Configuration: one dataclass per concern, named presets, and the command line that sets them.

Every field of GPTConfig (model.py), DataConfig (data.py), ParallelConfig
(parallel.py) and the dataclasses below is a flag, `--name value`, type-checked;
defaults < preset < command line. nanoGPT's names mean the same here.

    python train.py --preset shakespeare --n_layer 6 --learning_rate 3e-4
"""

import argparse
import dataclasses
import difflib
import os
from dataclasses import dataclass

from data import DataConfig
from model import GPTConfig
from parallel import ParallelConfig

# ----------------------------------------------------------------------------
# The run's settings; defaults are the `tiny` preset


@dataclass
class TrainConfig:
    out_dir: str = ""  # where the run writes; "" = out/<preset>
    data_dir: str = ""  # prepared token files; "" = data/<source>-<tokenizer>, prepared on first use
    mix: str = ""  # a JSON file naming several sources, their weights and a schedule of weights (mixture.py)
    max_epochs: float = 4.0  # a plan that reads the training data more often than this stops at start-up; 0 = any
    # start from these weights instead of a fresh init (fresh optimizer, step 0; transfer.py): a run's out_dir,
    # a Hugging Face GPT-2 folder or .safetensors file, or gpt2 | gpt2-medium | gpt2-large | gpt2-xl (downloaded once)
    init_from: str = ""
    init_url: str = ""  # where to download a named --init_from from; "" = Hugging Face (file:///path works offline)
    overwrite: bool = False  # allow replacing a different run in out_dir
    seed: int = 1337
    device: str = "auto"  # auto (cuda, then mps, then cpu) | cpu | cuda | cuda:N | mps
    # auto: bfloat16 on GPUs and CPUs that have it natively, else float16 on GPUs, float32 on CPUs
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    compile: bool = False  # torch.compile the model
    # batch: one optimizer step sees batch_size * gradient_accumulation_steps sequences of block_size tokens
    batch_size: int = 16  # sequences per forward pass (per process)
    gradient_accumulation_steps: int = 1
    lanes: int = 64  # the token file is read as this many interleaved lanes (see data.TokenStream)
    data_order: int = 0  # 0: the file's order (in lanes); N > 0: the same windows shuffled by seed N
    # AdamW, LR schedule, clipping
    max_iters: int = 2000
    learning_rate: float = 2e-3  # peak LR, reached at the end of warmup
    min_lr: float = 2e-4  # the cosine ends here, at lr_decay_iters
    warmup_iters: int = 100
    lr_decay_iters: int = 0  # 0 = max_iters
    weight_decay: float = 0.1  # on matrices and embeddings; never on norms and biases
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    # monitoring
    log_interval: int = 25
    log_to: str = ""  # also log to: tensorboard, wandb, or both ("tensorboard,wandb"); "" = metrics.jsonl only
    eval_interval: int = 250
    eval_iters: int = 20  # global batches per val-loss estimate: always the first ones of val.bin
    peak_tflops: float = 0.0  # device peak for MFU; 0 = look it up by GPU name


@dataclass
class RecoveryConfig:
    ckpt_interval: int = 100  # steps between checkpoints (in out_dir/ckpt/)
    keep_last: int = 3  # retention, dense recent: the newest keep_last checkpoints...
    keep_every: int = 1000  # ...and sparse old: every checkpoint at a multiple of this step
    resume: bool = False  # insist on resuming (a run whose out_dir holds checkpoints resumes anyway)
    reset_optimizer: bool = False  # accept a checkpoint without optimizer state (fresh AdamW moments)
    # teaching: resume as if the checkpoint had not saved these, of optimizer,data_position,schedule
    # (fresh AdamW moments; train.bin read again from its start; the LR schedule restarted from warmup)
    resume_without: str = ""
    triggers: str = "nonfinite,spike"  # detectors that roll back; of nonfinite,spike,grad_z,val_rise
    spike_factor: float = 2.0  # spike: loss above this many times the median of recent losses
    monitor_window: int = 50  # steps in the rolling baselines of loss and grad norm
    grad_z_threshold: float = 8.0  # grad_z: grad norm this many std above its recent mean; 0 = off
    val_rise_evals: int = 3  # val_rise: val loss up this many evals in a row while train loss falls; 0 = off
    # The runbook (train.respond_to_incident): every incident rolls back to the newest healthy
    # checkpoint and skips the data that led to it; a repeat within incident_window steps (0: never) also...
    incident_window: int = 200
    repeat_response: str = "lower_lr"  # ...lower_lr: multiplies the LR by incident_lr_scale from then on | rewarm
    incident_lr_scale: float = 0.5
    rewarm_iters: int = 0  # rewarm: steps to climb from 0 back to the scheduled LR; 0 = warmup_iters
    max_incidents: int = 5  # more incidents than this stop the run
    inject: str = ""  # faults for teaching and tests: nan@STEP,spike@STEP,crash@STEP

    RESUMABLE = ("optimizer", "data_position", "schedule")

    def __post_init__(self):
        if self.repeat_response not in ("lower_lr", "rewarm"):
            raise ValueError(f"--repeat_response {self.repeat_response!r}: choose lower_lr or rewarm")
        unknown = set(self.forgotten_on_resume) - set(self.RESUMABLE)
        if unknown:
            raise ValueError(f"--resume_without {','.join(sorted(unknown))}: choose from {','.join(self.RESUMABLE)}")

    @property
    def forgotten_on_resume(self):
        return [part for part in self.resume_without.split(",") if part]


@dataclass
class SampleConfig:
    prompt: str = ""  # text to continue; "" = start from the end-of-text token
    num_samples: int = 3
    max_new_tokens: int = 300
    temperature: float = 0.8
    top_k: int = 200
    top_p: float = 1.0  # nucleus sampling: the fewest tokens whose probabilities sum to top_p; 1.0 = all of them
    kv_cache: bool = True  # keep each layer's keys and values: one token's forward per new token, not the context's


@dataclass
class ExportConfig:
    export_hf: str = ""  # a mode: write the newest checkpoint in --out_dir to this folder as a transformers GPT-2


@dataclass
class BenchmarkConfig:  # the benchmark of the final check and --eval_only (evaluation.py)
    benchmark: str = ""  # "" = none | hellaswag (downloaded, sha256-checked) | a local .jsonl file in its format
    benchmark_url: str = ""  # where to fetch hellaswag from; "" = its public URL (file:///path works offline)
    benchmark_examples: int = 0  # score the first N examples only; 0 = all
    benchmark_dir: str = os.path.join("data", "hellaswag")  # where the download is kept

    def __post_init__(self):
        if self.benchmark_examples < 0:
            raise ValueError(f"--benchmark_examples {self.benchmark_examples}: give a count, or 0 for all")


# fmt: off
PRESETS = {
    "tiny": {},  # the defaults above: ~0.8M parameters on Python's own source code, minutes on a laptop CPU
    # nanoGPT's CPU "baby GPT", the same model and batch, with a faster schedule: RMSNorm and the
    # width-scaled init keep twice its LR stable, and a cosine that ends at step 1500 (then holds 1e-4)
    # reaches its final loss sooner (DESIGN.md, "Choices measured"; bench/time_to_loss.py).
    # 144 eval batches read val.bin once.
    "shakespeare": dict(
        source="shakespeare", block_size=64, batch_size=12, n_layer=4, n_head=4, n_embd=128,
        max_iters=2000, learning_rate=2e-3, min_lr=1e-4, lr_decay_iters=1500, warmup_iters=100, beta2=0.99,
        eval_iters=144, log_interval=10,
    ),
    # GPT-2 small (124M) on one GPU: 2^19 tokens per step (16 x 1024 x 32), 19073 steps = 10B tokens. GPT-2's
    # architecture exactly (LayerNorm with biases, biases in every Linear, GELU's tanh approximation; learned
    # positions and the tied head as every preset), so GPT-2's weights load into it and its runs export to it.
    # No source: a 10B-token plan needs a corpus the user names (source "" is refused at start-up).
    "gpt2-small": dict(
        source="", tokenizer="gpt2", block_size=1024, n_layer=12, n_head=12, n_embd=768,
        norm="layernorm", bias=True, activation="gelu_tanh",
        batch_size=16, gradient_accumulation_steps=32, lanes=512, max_iters=19073,
        learning_rate=6e-4, min_lr=6e-5, warmup_iters=700, beta2=0.95,
        log_interval=10, eval_interval=500, eval_iters=4, compile=True, benchmark="hellaswag",
    ),
}
# fmt: on


def parse_bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


@dataclass
class Configs:
    """A run's settings, one dataclass per concern; every field of each is a flag."""

    model: GPTConfig
    data: DataConfig
    train: TrainConfig
    parallel: ParallelConfig
    recovery: RecoveryConfig
    sample: SampleConfig
    benchmark: BenchmarkConfig
    export: ExportConfig


MODES = ("sample", "eval_only", "export_hf")  # what to do instead of training: a flag each, at most one


def parse_args(argv):
    """--preset NAME, --sample, --eval_only or --export_hf DIR, and --field value for every field of the config
    dataclasses.

    Precedence: dataclass default < preset < command line. Returns
    (preset, mode: "train" or one of MODES, Configs).
    """
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--preset", default="tiny", help=f"one of: {', '.join(PRESETS)}")
    # a boolean flag alone means true (--resume); --resume true|false also works
    boolean = dict(type=parse_bool, nargs="?", const=True, metavar="true|false")
    parser.add_argument("--sample", default=False, help="sample from the newest checkpoint in --out_dir", **boolean)
    parser.add_argument(
        "--eval_only",
        default=False,
        help="val loss and the benchmark of the newest checkpoint in "
        "--out_dir, logged to its metrics.jsonl; no training",
        **boolean,
    )
    owner = {}  # flag name -> the Configs field whose dataclass has it
    concerns = dataclasses.fields(Configs)
    for concern in concerns:
        for f in dataclasses.fields(concern.type):
            if f.name in ("vocab_size",):  # set from the data, not by hand
                continue
            owner[f.name] = concern.name
            kind = boolean if f.type is bool else dict(type=f.type)
            parser.add_argument(
                f"--{f.name}", default=None, help=f"{concern.type.__name__} (default {f.default!r})", **kind
            )
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flag = unknown[0].split("=")[0]
        valid = ["--preset", "--sample", "--eval_only"] + [f"--{name}" for name in owner]
        close = difflib.get_close_matches(flag, valid, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        parser.error(f"unknown flag {flag}{hint}. Valid flags: {' '.join(valid)}")
    if args.preset not in PRESETS:
        parser.error(f"unknown preset {args.preset!r}: choose one of {', '.join(PRESETS)}")
    modes = [mode for mode in MODES if getattr(args, mode)]
    if len(modes) > 1:
        parser.error(f"--{modes[0]} and --{modes[1]} exclude each other: give one")
    if modes and args.overwrite:  # they read a run: starting it over would delete what they came to read
        parser.error(f"--{modes[0]} reads the run in --out_dir, and --overwrite would delete it: drop --overwrite")
    values = {**PRESETS[args.preset], **{k: v for k, v in vars(args).items() if v is not None and k in owner}}
    configs = Configs(
        **{
            concern.name: concern.type(**{k: v for k, v in values.items() if owner[k] == concern.name})
            for concern in concerns
        }
    )
    return args.preset, modes[0] if modes else "train", configs
