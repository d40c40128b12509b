"""Configuration: one dataclass per concern, named presets, and the command line that sets them.

Every field of GPTConfig (model.py, with the arms of ArmsConfig: arms.py), DataConfig (corpus.py), Layout
(parallel/grid.py) and the dataclasses below is a flag, `--name value`, type-checked;
defaults < preset < --config file < command line. nanoGPT's names mean the same here.
A config file (JSON, or TOML on Python 3.11+) holds the same settings, one table
per concern; a preset is such a file in presets/, and a run's run.json is one too.

    python train.py --preset shakespeare --n_layer 6 --learning_rate 3e-4
    python train.py --config out/tiny/run.json --out_dir out/again    # the same run again
"""

import argparse
import dataclasses
import difflib
import json
import os
import sys
from dataclasses import asdict, dataclass

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # Python 3.10: JSON config files only
    tomllib = None

from errors import UserError
from machinery.corpora.corpus import DataConfig
from machinery.interchange.transfer import hf_folder_config, hf_tokenizer_of
from machinery.job.arms import ArmsConfig
from parallel.grid import Layout

# ----------------------------------------------------------------------------
# The run's settings; defaults are the `tiny` preset


@dataclass
class TrainConfig:
    out_dir: str = ""  # where the run writes; "" = out/<preset>
    # prepared token files; "" = data/<source>-<tokenizer>, prepared on first use (a folder named here is prepared
    # only from a named source: the embedded default fills its own folder alone)
    data_dir: str = ""
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
    plot: bool = True  # draw the run's figures at its end (false: a sweep of many short runs saves ~1 s a run)
    eval_interval: int = 250
    eval_iters: int = 20  # global batches per val-loss estimate: always the first ones of val.bin
    peak_tflops: float = 0.0  # device peak for MFU; 0 = look it up by GPU name


@dataclass
class RecoveryConfig:
    ckpt_interval: int = 100  # steps between checkpoints (in out_dir/ckpt/)
    keep_last: int = 3  # retention, dense recent: the newest keep_last checkpoints...
    keep_every: int = 1000  # ...and sparse old: every checkpoint at a multiple of this step
    # a second run folder (on another disk or file system) whose ckpt/ holds a verified copy of every checkpoint;
    # resume takes the newest that verifies in either
    ckpt_mirror: str = ""
    resume: bool = False  # insist on resuming (a run whose out_dir holds checkpoints resumes anyway)
    # the checkpoint --sample, --eval_only and --export_hf read: -1 = the newest that verifies (--export_hf: the
    # newest, which must verify); a step = that step's, which must verify
    ckpt_step: int = -1
    reset_optimizer: bool = False  # accept a checkpoint without optimizer state (fresh AdamW moments)
    # teaching: resume as if the checkpoint had not saved these, of optimizer,data_position,schedule
    # (fresh AdamW moments; train.bin read again from its start; the LR schedule restarted from warmup)
    resume_without: str = ""
    triggers: str = "nonfinite,spike"  # detectors that roll back; of nonfinite,spike,grad_z,val_rise
    spike_factor: float = 2.0  # spike: loss above this many times the median of recent losses
    monitor_window: int = 50  # steps in the rolling baselines of loss and grad norm
    grad_z_threshold: float = 8.0  # grad_z: grad norm more than this many std above its recent mean; 0 = off
    val_rise_evals: int = 3  # val_rise: val loss up this many evals in a row while train loss falls; 0 = off
    # The runbook (incidents.Incidents.respond): every incident rolls back to the newest healthy
    # checkpoint and skips the data that led to it; a repeat within incident_window steps (0: never) also...
    incident_window: int = 200
    repeat_response: str = "lower_lr"  # ...lower_lr: multiplies the LR by incident_lr_scale from then on | rewarm
    incident_lr_scale: float = 0.5
    rewarm_iters: int = 0  # rewarm: steps to climb from 0 back to the scheduled LR; 0 = warmup_iters
    max_incidents: int = 5  # more incidents than this stop the run
    inject: str = ""  # faults for teaching and tests: nan@STEP,spike@STEP,crash@STEP,hang@STEP (faults.py)

    RESUMABLE = ("optimizer", "data_position", "schedule")

    def __post_init__(self):
        if self.repeat_response not in ("lower_lr", "rewarm"):
            raise UserError(f"--repeat_response {self.repeat_response!r}: choose lower_lr or rewarm")
        if self.ckpt_step < -1:
            raise UserError(f"--ckpt_step {self.ckpt_step}: a step that has a checkpoint, or -1 for the newest")
        if self.monitor_window < 2:
            raise UserError(f"--monitor_window {self.monitor_window}: the baselines need 2 healthy steps or more")
        unknown = set(self.forgotten_on_resume) - set(self.RESUMABLE)
        if unknown:
            raise UserError(f"--resume_without {','.join(sorted(unknown))}: choose from {','.join(self.RESUMABLE)}")

    @property
    def forgotten_on_resume(self):
        return [part for part in self.resume_without.split(",") if part]


@dataclass
class SampleConfig:
    prompt: str = ""  # text to continue; "" = start from the end-of-text token
    num_samples: int = 3  # 0: a training run writes no samples at its end (--sample needs at least 1)
    max_new_tokens: int = 300
    temperature: float = 0.8  # 0 = greedy: the most likely token every time
    top_k: int = 200  # draw among the top_k most likely tokens; 0 = all of them
    top_p: float = 1.0  # nucleus sampling: the fewest tokens whose probabilities sum to top_p; 1.0 = all of them
    kv_cache: bool = True  # keep each layer's keys and values: one token's forward per new token, not the context's

    def __post_init__(self):  # here, not when sampling starts: at the end of a run that would be hours later
        if self.num_samples < 0:
            raise UserError(f"--num_samples {self.num_samples}: a count, 0 or more (0: a run writes no samples)")
        if self.max_new_tokens < 1:
            raise UserError(f"--max_new_tokens {self.max_new_tokens}: a count of tokens, 1 or more")
        if not self.temperature >= 0:  # written so that nan is refused too
            raise UserError(f"--temperature {self.temperature}: 0 or more (0: greedy, the most likely token)")
        if self.top_k < 0:
            raise UserError(f"--top_k {self.top_k}: 0 or more (0: no top-k, every token may be drawn)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top_p {self.top_p}: a share of the probability, above 0 and at most 1 (1 keeps all)")


@dataclass
class ExportConfig:
    # a mode: write the newest checkpoint in --out_dir (or --ckpt_step's) to this folder as a transformers GPT-2
    export_hf: str = ""
    max_shard_mb: float = 5000.0  # --export_hf: model.safetensors up to this size, else numbered shards and an index


@dataclass
class BenchmarkConfig:  # the benchmark of the final check and --eval_only (evaluation.py)
    benchmark: str = ""  # "" = none | hellaswag (downloaded, sha256-checked) | a local .jsonl file in its format
    benchmark_url: str = ""  # where to fetch hellaswag from; "" = its public URL (file:///path works offline)
    benchmark_examples: int = 0  # score the first N examples only; 0 = all
    benchmark_dir: str = os.path.join("data", "hellaswag")  # where the download is kept

    def __post_init__(self):
        if self.benchmark_examples < 0:
            raise UserError(f"--benchmark_examples {self.benchmark_examples}: give a count, or 0 for all")


def parse_bool(text):
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


@dataclass
class Configs:
    """A run's settings, one dataclass per concern; every field of each is a flag."""

    model: ArmsConfig  # the GPT's configuration with the notebooks' counterfactual arms (arms.py)
    data: DataConfig
    train: TrainConfig
    parallel: Layout  # the [parallel] table of a config file
    recovery: RecoveryConfig
    sample: SampleConfig
    benchmark: BenchmarkConfig
    export: ExportConfig


MODES = ("sample", "eval_only", "export_hf")  # what to do instead of training: a flag each, at most one


# ----------------------------------------------------------------------------
# Config files: JSON, or TOML where Python reads it. A preset is such a file, shipped in presets/.

CONCERNS = {concern.name: concern.type for concern in dataclasses.fields(Configs)}  # "model": ArmsConfig, ...
NOT_FLAGS = ("vocab_size",)  # set from the data, not by hand
# every flag: name -> (the concern whose dataclass has it, its dataclasses.Field)
FLAGS = {
    f.name: (name, f) for name, kind in CONCERNS.items() for f in dataclasses.fields(kind) if f.name not in NOT_FLAGS
}
# what one command does to a run, not what the run is: never recorded
ACTIONS = ("overwrite", "resume", "ckpt_step", "export_hf", "max_shard_mb")
PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "presets")
DEFAULT_PRESET = "tiny"


def did_you_mean(name, valid):
    """' (did you mean X?)' for the valid name closest to a misspelt one, or ''."""
    close = difflib.get_close_matches(name, valid, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def checked_value(where, kind, value):
    """value as a flag of type `kind` would hold it, or UserError naming `where` (FILE: section.name)."""
    if kind is bool:
        ok, wanted = isinstance(value, bool), "true or false"
    elif kind is int:
        ok, wanted = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif kind is float:
        ok, wanted = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        value = float(value) if ok else value
    elif kind is str:
        ok, wanted = isinstance(value, str), "a string"
    else:
        raise TypeError(f"{where}: no config-file reading for fields of type {kind}")
    if not ok:
        raise UserError(f"{where} = {value!r}: expected {wanted}")
    return value


def read_config_file(path):
    """(preset name or None, {flag: value}, whether the file is a run's run.json) from a config file, JSON or TOML
    (TOML needs tomllib: Python 3.11+).

    The format: one table per concern, named as Configs names them (model, data, train, parallel, recovery,
    sample, benchmark), each holding flags of that concern with values of the flag's type; an optional
    "preset" whose values these go over, and an optional "about" (text for the reader, which JSON lacks comments
    for). Every key is optional. A run's run.json holds its configuration in this format under "config", so a
    run.json is a config file too: one that set every setting there was when the run started (a setting added since
    reads as its default).
        {"preset": "shakespeare", "model": {"n_layer": 6}, "train": {"learning_rate": 3e-4}}
    """
    (document, recorded_run), values = load_config_document(str(path)), {}
    for key, table in document.items():
        if key in ("preset", "about"):
            checked_value(f"{path}: {key}", str, table)
        elif key in CONCERNS and isinstance(table, dict):
            for name, value in table.items():
                values[name] = checked_value(f"{path}: {key}.{name}", flag_in_table(path, key, name).type, value)
        elif key in CONCERNS:
            raise UserError(f"{path}: {key} = {table!r}: {key} is a table of {CONCERNS[key].__name__}'s fields")
        elif key in FLAGS:
            raise UserError(
                f"{path}: {key} at the top level: settings go in their concern's table: {FLAGS[key][0]}.{key}"
            )
        else:
            valid = ["preset", "about", *CONCERNS]
            raise UserError(f"{path}: unknown key {key}{did_you_mean(key, valid)}; valid keys: {', '.join(valid)}")
    return document.get("preset"), values, recorded_run


def load_config_document(path):
    """(the mapping a config file holds, whether the file is a run's run.json, whose "config" it is), UserError
    naming the file where there is none."""
    if path.endswith(".toml"):
        if tomllib is None:
            raise UserError(
                f"--config {path}: TOML is read with tomllib, which came with Python 3.11, and this is Python "
                f"{sys.version_info.major}.{sys.version_info.minor}: write the file as JSON"
            )
        load = tomllib.loads
    elif path.endswith(".json"):
        load = json.loads
    else:
        raise UserError(f"--config {path}: name a .json or .toml file")
    try:
        with open(path, encoding="utf-8") as f:
            document = load(f.read())
    except OSError as e:
        raise UserError(f"--config {path}: {e.strerror}") from None
    except ValueError as e:  # json.JSONDecodeError and tomllib.TOMLDecodeError both are
        raise UserError(f"--config {path} is not valid {path.rsplit('.', 1)[1].upper()}: {e}") from None
    recorded_run = isinstance(document, dict) and "GPTConfig" in document  # a run.json: its identity, and its config
    if recorded_run:
        if "config" not in document:
            raise UserError(
                f"{path} is the run.json of a run that did not record its configuration (it holds only the run's "
                "identity: written before runs recorded it, or by a command that stopped before its first step), so "
                "it cannot be repeated from it: give the run's flags instead"
            )
        document = document["config"]
    if not isinstance(document, dict):
        raise UserError(f"{path}: a config file holds a mapping of tables, not {document!r}")
    return document, recorded_run


def flag_in_table(path, table, name):
    """The dataclass field of flag `name` found in `table` of a config file, or UserError naming the file and key."""
    concern, field = FLAGS.get(name, (None, None))
    if name in ACTIONS:
        raise UserError(f"{path}: {table}.{name} is what one command does, not a setting a file keeps: give --{name}")
    if concern is not None and concern != table:
        raise UserError(f"{path}: {table}.{name}: {name} is a setting of {concern}, so it goes in {concern}.{name}")
    if concern is None:
        close = difflib.get_close_matches(name, [n for n in FLAGS if n not in ACTIONS], n=1)  # in any table
        hint = f" (did you mean {FLAGS[close[0]][0]}.{close[0]}?)" if close else ""
        valid = ", ".join(n for n, (c, _) in FLAGS.items() if c == table and n not in ACTIONS)
        raise UserError(f"{path}: unknown key {table}.{name}{hint}; valid keys of {table}: {valid}")
    return field


def read_preset(name):
    """A preset's values: presets/NAME.json, read as any --config file; a preset goes over the defaults only."""
    preset, values, _ = read_config_file(os.path.join(PRESET_DIR, f"{name}.json"))
    if preset is not None:
        raise UserError(f"presets/{name}.json names a preset ({preset!r}): a preset goes over the defaults only")
    return values


def read_presets():
    """{name: {flag: value}} of the files in presets/: the default first, then the smaller models (--help's order)."""
    names = [file.removesuffix(".json") for file in os.listdir(PRESET_DIR) if file.endswith(".json")]
    presets = {name: read_preset(name) for name in names}

    def size(name):
        model = {**asdict(ArmsConfig()), **presets[name]}
        return model["n_layer"] * model["n_embd"] ** 2

    return {
        name: presets[name] for name in sorted(presets, key=lambda name: (name != DEFAULT_PRESET, size(name), name))
    }


PRESETS = read_presets()


def config_file_form(preset, configs):
    """The configuration in read_config_file's format: the preset's name and every flag's value by concern (what one
    command does, ACTIONS, left out). A run records it in run.json under "config", for `--config OUT/run.json`."""
    tables = {
        section: {k: v for k, v in asdict(getattr(configs, section)).items() if k in FLAGS and k not in ACTIONS}
        for section in CONCERNS
    }
    return {"preset": preset, **{section: table for section, table in tables.items() if table}}


def take_architecture_from(values, given):
    """values with every model field of --init_from's Hugging Face folder (its config.json): a run from a folder
    needs no model flags. A model flag (or config file value) in `given` that contradicts the folder is refused,
    naming both values; block_size is the run's up to the folder's (a smaller one crops the positions); the attention
    kernel, dropout and the init are this run's.
    A tokenizer.json in the folder is the run's --tokenizer unless one is given: the base's vocabulary."""
    source = hf_folder_config(values["init_from"])
    if source is None:  # a run of ours, a bare file: transfer.fit_to_run checks the run's model
        return values
    # the architecture: not the vocabulary (the data's), the kernel, or how this run trains and initializes
    this_runs = ("vocab_size", "attention", "dropout", "naive_init_std", "embedding_init")
    theirs = {k: v for k, v in asdict(source).items() if k not in this_runs}
    if "block_size" not in given:  # the run's context (its preset's), up to the base's: a longer one costs memory
        theirs["block_size"] = min(values.get("block_size", ArmsConfig().block_size), source.block_size)
    for key, value in theirs.items():
        if key in given and given[key] != value and not (key == "block_size" and given[key] < value):
            raise UserError(
                f"--{key} {given[key]} contradicts --init_from {values['init_from']}, whose config.json says {key} "
                f"{value}: leave --{key} out, and the run takes the folder's"
            )
    # a Llama base's own tokenizer.json: its vocabulary, its ids (GPT-2's is tiktoken's gpt2)
    tokenizer = hf_tokenizer_of(values["init_from"]) if source.arch == "llama" else None
    return {
        **values,
        **{k: v for k, v in theirs.items() if k not in given},
        **({"tokenizer": tokenizer} if tokenizer and "tokenizer" not in given else {}),
    }


def parse_args(argv):
    """--preset NAME, --config FILE, --sample, --eval_only or --export_hf DIR, and --field value for every field of
    the config dataclasses.

    Precedence: dataclass default < preset (--preset, else the file's, else tiny) < --config file < command line.
    Returns (preset, mode: "train" or one of MODES, Configs). A bad config file raises UserError naming it.
    """
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--preset", default=None, help=f"one of: {', '.join(PRESETS)} (default {DEFAULT_PRESET})")
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="settings from a .json or .toml file (a run's run.json repeats that run), over the preset; "
        "flags go over the file",
    )
    # a boolean flag alone means true (--resume); --resume true|false also works
    boolean = dict(type=parse_bool, nargs="?", const=True, metavar="true|false")
    parser.add_argument(
        "--sample", default=False, help="sample from the newest checkpoint in --out_dir (or --ckpt_step's)", **boolean
    )
    parser.add_argument(
        "--eval_only",
        default=False,
        help="val loss and the benchmark of the newest checkpoint in "
        "--out_dir (or --ckpt_step's), logged to its metrics.jsonl; no training",
        **boolean,
    )
    for name, (concern, f) in FLAGS.items():
        kind = boolean if f.type is bool else dict(type=f.type)
        help = f"{CONCERNS[concern].__name__} (default {f.default!r})"
        parser.add_argument(f"--{name}", default=None, help=help, **kind)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flag = unknown[0].split("=")[0]
        valid = ["--preset", "--config", "--sample", "--eval_only"] + [f"--{name}" for name in FLAGS]
        parser.error(f"unknown flag {flag}{did_you_mean(flag, valid)}. Valid flags: {' '.join(valid)}")
    file_preset, file_values, recorded_run = read_config_file(args.config) if args.config else (None, {}, False)
    if args.preset and file_preset not in (None, args.preset) and recorded_run:
        parser.error(
            f"--preset {args.preset} beside --config {args.config}, which sets every setting (a run's recorded "
            f"configuration, built on preset {file_preset!r}): the preset would change only its name and the default "
            "--out_dir. Drop --preset, and give the settings you want to change as flags"
        )
    preset = args.preset or file_preset or DEFAULT_PRESET
    if preset not in PRESETS:
        named_in = f" (named in {args.config})" if preset == file_preset and not args.preset else ""
        parser.error(f"unknown preset {preset!r}{named_in}: choose one of {', '.join(PRESETS)}")
    modes = [mode for mode in MODES if getattr(args, mode)]
    if len(modes) > 1:
        parser.error(f"--{modes[0]} and --{modes[1]} exclude each other: give one")
    if modes and args.overwrite:  # they read a run: starting it over would delete what they came to read
        parser.error(f"--{modes[0]} reads the run in --out_dir, and --overwrite would delete it: drop --overwrite")
    flags = {k: v for k, v in vars(args).items() if v is not None and k in FLAGS}
    values = {**PRESETS[preset], **file_values, **flags}
    if values.get("init_from"):
        values = take_architecture_from(values, {**file_values, **flags})
    configs = Configs(
        **{
            concern: kind(**{k: v for k, v in values.items() if FLAGS[k][0] == concern})
            for concern, kind in CONCERNS.items()
        }
    )
    if not modes and configs.recovery.ckpt_step != -1:  # a run resumes from its newest: the flag would do nothing
        parser.error(
            f"--ckpt_step {configs.recovery.ckpt_step} chooses the checkpoint --sample, --eval_only or --export_hf "
            "reads: give it with one of them"
        )
    if modes == ["sample"] and configs.sample.num_samples == 0:
        parser.error("--sample with --num_samples 0 would print nothing: give --num_samples 1 or more")
    return preset, modes[0] if modes else "train", configs
