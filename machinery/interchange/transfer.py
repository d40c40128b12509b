"""Weights in and out of a run: pretrained starts (a run, a Hugging Face folder, a named base) and exports.

    python train.py --preset gpt2-small --init_from gpt2 --source my_texts/   # start from OpenAI's GPT-2
    python train.py --export_hf out/hf --out_dir out/gpt2-run                 # a folder transformers and lm-eval load

In: `initial_weights` reads a run's out_dir (its newest healthy checkpoint), a
Hugging Face GPT-2 or Llama folder or .safetensors file, or a named base
(downloaded once, sha256-checked), and `fit_to_run` checks the weights fit the
run's model. Out: `export_hf` writes a run's weights as a transformers folder
(GPT2LMHeadModel or LlamaForCausalLM) with its tokenizer files, which
`lm_eval --model hf` scores.

The files are safetensors (safetensors_format.py, code of our own) in Hugging Face's layouts of
the two families (hf_layouts.py).
"""

import contextlib
import json
import os
import re
import urllib.request
import uuid
from dataclasses import asdict, replace
from typing import NamedTuple

import torch

from errors import UserError
from machinery.components import checkpoint
from machinery.components.run_folder import recorded_gpt_config
from machinery.corpora.corpus import get_tokenizer
from machinery.interchange.hf_layouts import (
    EXPORTED_BY,
    GPT2_ARCHITECTURE,
    LLAMA_ARCHITECTURE,
    count_blocks,
    flag_text,
    gpt_config_from_hf,
    hf_config,
    llama_config_from_hf,
    llama_hf_config,
    llama_state_dict_to_hf,
    state_dict_from_hf,
    state_dict_to_hf,
)
from machinery.interchange.safetensors_format import (
    SHARD_INDEX,
    read_safetensors,
    read_safetensors_folder,
    shard_writers,
)
from machinery.job import files
from machinery.job.arms import ArmedGPT, ArmsConfig
from machinery.job.cluster import say
from model import GPTConfig, padded_vocab_size

# ----------------------------------------------------------------------------
# Where a run's first weights come from


HUB = "https://huggingface.co"  # where a named base comes from
NAMED_WEIGHTS_DIR = os.path.join("data", "weights")  # a named base lands in data/weights/<name>/


class NamedBase(NamedTuple):
    """A published base --init_from takes by name: its files fetched once from the hub into a folder of ours."""

    repo: str  # on the hub: "openai-community/gpt2"
    revision: str  # a commit of the repository, so the bytes cannot change under the hashes
    files: dict  # {file name: its published sha256, or None where none was found (the hub's is asked instead)}
    gpt_config: GPTConfig  # what its config.json says: the run's architecture before anything is downloaded


def _gpt2(name, revision, sha256, n_layer, n_head, n_embd):
    # GPT-2's architecture is ours (GPT2_ARCHITECTURE) and its tokenizer is tiktoken's: the weights are all we fetch
    architecture = dict(block_size=1024, vocab_size=50257, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    return NamedBase(
        f"openai-community/{name}",
        revision,
        {"model.safetensors": sha256},
        GPTConfig(**architecture, **GPT2_ARCHITECTURE),
    )


# sha256: the Git LFS oid of that revision's file (the file's own hash for a small one), as projects that pin these
# revisions publish it. gpt2-large's was found nowhere: its download is checked against the hash the hub gives.
NAMED_BASES = {
    "gpt2": _gpt2(
        "gpt2",
        "607a30d783dfa663caf39e06633721c8d4cfcd7e",
        "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707",
        n_layer=12,
        n_head=12,
        n_embd=768,
    ),
    "gpt2-medium": _gpt2(
        "gpt2-medium",
        "6dcaa7a952f72f9298047fd5137cd6e4f05f41da",
        "fc5a354a19255ad494f3d71549390baca1ccf61d1d822b9408971705c687c9cd",
        n_layer=24,
        n_head=16,
        n_embd=1024,
    ),
    "gpt2-large": _gpt2(
        "gpt2-large", "32b71b12589c2f8d625668d2335a01cac3249519", None, n_layer=36, n_head=20, n_embd=1280
    ),
    "gpt2-xl": _gpt2(
        "gpt2-xl",
        "15ea56dee5df4983c59b2538573817e1667135e2",
        "0f8b28eb05a8075f48b61b6f35332978c74fc7763fa9fb4051a1c30511736a6a",
        n_layer=48,
        n_head=25,
        n_embd=1600,
    ),
    # a Llama-family base: 30 blocks of width 576, 9 query heads sharing 3 key/value heads, its own BPE of 49,152
    "SmolLM2-135M": NamedBase(
        "HuggingFaceTB/SmolLM2-135M",
        "93efa2f097d58c2a74874c7e644dbc9b0cee75a2",
        {
            "config.json": "1d556eab73b69c7f11f64c557a2f9c6f440bd4c6b89bb2584a6b498c92603843",
            "tokenizer.json": "9ca9acddb6525a194ec8ac7a87f24fbba7232a9a15ffa1af0c1224fcd888e47c",
            "model.safetensors": "80521b40281d6ce74e35c9282c22539e75aa0ac8578892b2a59955ef78d55da1",
        },
        llama_config_from_hf(  # the fields of that revision's config.json our GPT reads
            dict(
                max_position_embeddings=8192,
                vocab_size=49152,
                num_hidden_layers=30,
                num_attention_heads=9,
                num_key_value_heads=3,
                hidden_size=576,
                intermediate_size=1536,
                rope_theta=100000.0,
                rms_norm_eps=1e-5,
                tie_word_embeddings=True,
            )
        ),
    ),
}


def hf_folder_config(init_from):
    """The GPTConfig that the config.json of a Hugging Face folder describes (--init_from the folder, or a
    .safetensors file beside it), or a named base's, or None for any other --init_from (a run of ours, a bare file):
    the architecture a run from it takes (config.parse_args), as an ArmsConfig: with every arm at its default."""
    if is_named_base(init_from):
        return ArmsConfig.of(NAMED_BASES[init_from].gpt_config)
    if os.path.isfile(os.path.join(init_from, "run.json")):
        return None
    path = os.path.join(init_from if os.path.isdir(init_from) else os.path.dirname(init_from), "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return ArmsConfig.of(gpt_config_from_hf(json.load(f)))
    except (json.JSONDecodeError, UnicodeDecodeError, UserError) as e:  # not JSON, or neither GPT-2's nor Llama's
        raise UserError(f"{path}: {e}") from None


def hf_tokenizer_of(init_from):
    """The folder of --init_from as a --tokenizer, where it holds a tokenizer.json (a base's own), or will once a
    named base is fetched; else None."""
    if is_named_base(init_from):
        return named_base_folder(init_from) if "tokenizer.json" in NAMED_BASES[init_from].files else None
    folder = os.path.abspath(init_from if os.path.isdir(init_from) else os.path.dirname(init_from))  # from any cwd
    return folder if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None


def is_named_base(init_from):
    """A path that exists wins over a name: `git clone .../gpt2` makes a folder called gpt2."""
    return init_from in NAMED_BASES and not os.path.exists(init_from)


def named_base_folder(name):
    return os.path.abspath(os.path.join(NAMED_WEIGHTS_DIR, name))  # absolute: a --tokenizer read from any cwd


def fetch_named_base(name, init_url=""):
    """The folder holding a named base's files, fetched once (from --init_url, a folder's URL, if given) and each
    checked against its sha256: the pinned one, or where none was published, the one the hub gives for that
    revision's file (said so). A file that is there took its name only after its check (files.download)."""
    base = NAMED_BASES[name]
    if init_url.endswith(tuple(base.files)):
        raise UserError(
            f"--init_url {init_url} names a file: give the folder that holds {name}'s "
            f"{', '.join(base.files)}, e.g. {init_url.rsplit('/', 1)[0]}"
        )
    folder = named_base_folder(name)
    for filename, sha256 in base.files.items():
        if sha256 is None and os.path.isfile(os.path.join(folder, filename)):
            continue
        if sha256 is None:
            sha256 = hub_sha256(base, filename)
            say(f"{name}: no sha256 of its {filename} was published to pin, so it is checked against the hub's")
        spec = dict(
            url=f"{init_url.rstrip('/')}/{filename}"
            if init_url
            else f"{HUB}/{base.repo}/resolve/{base.revision}/{filename}",
            sha256=sha256,
            filename=filename,
            offline_flags=("--init_from", "--init_url"),  # how a user without network hands over a local copy
        )
        files.download(f"{name}'s {filename}", folder, spec)
    return folder


def hub_sha256(base, filename):
    """The sha256 the hub lists for a file of a pinned revision (its Git LFS oid): the check where none is pinned."""
    url = f"{HUB}/api/models/{base.repo}/tree/{base.revision}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            listing = json.load(response)
        return next(entry["lfs"]["oid"] for entry in listing if entry["path"] == filename and entry.get("lfs"))
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        raise UserError(
            f"{base.repo} has no sha256 pinned here for its {filename}, and the hub's could not be read from {url} "
            f"({type(e).__name__}: {e}). Download the folder yourself from "
            f"{HUB}/{base.repo}/tree/{base.revision} and pass --init_from path/to/folder"
        ) from None


class Source(NamedTuple):
    """What --init_from hands a run."""

    gpt_config: GPTConfig | None  # the source's; None where unknown (a bare .safetensors)
    state_dict: dict  # in our names
    tokenizer: str | None  # its tokenizer's name; None where unknown
    description: str  # for messages: "out/base, its checkpoint of step 400"
    data: dict | None = None  # a run of ours: what it read (its run.json's "data"); None: unknown


def initial_weights(init_from, init_url=""):
    """The Source of --init_from, which is one of:
    - a run's out_dir: its newest healthy checkpoint;
    - a Hugging Face GPT-2 or Llama folder: its model.safetensors (or shards), and the config.json beside it;
    - a .safetensors file in GPT-2's layout (its config.json, if one lies beside it);
    - a name in NAMED_BASES: fetched once into data/weights/<name>/ (from --init_url if given), then read as a
      folder, where GPT-2's holds the weights only (its architecture is GPT2_ARCHITECTURE, its tokenizer tiktoken's)."""
    if is_named_base(init_from):
        base = NAMED_BASES[init_from]
        folder = fetch_named_base(init_from, init_url)
        weights = _read_hf_weights(os.path.join(folder, "model.safetensors"))
        gpt2 = base.gpt_config.arch == "gpt2"
        gpt_config, tokenizer = (base.gpt_config, "gpt2") if gpt2 else (hf_folder_config(folder), folder)
        return Source(gpt_config, weights, tokenizer, f"{init_from} (at {base.revision[:12]})")
    if os.path.isfile(os.path.join(init_from, "run.json")):  # a run of ours
        ckpt_dir = os.path.join(init_from, "ckpt")
        latest = checkpoint.load_latest(ckpt_dir, healthy_only=True)
        if latest is None:
            raise UserError(
                f"--init_from {init_from} is a run with no healthy checkpoint in {ckpt_dir} that verifies: "
                "train it further, or start from another run"
            )
        step, state = latest
        newest = checkpoint.list_steps(ckpt_dir)[0]  # newest first
        if newest != step:  # say so, loudly: a finished run's last weights are what one expects to get
            say(
                f"warning: --init_from {init_from}: its newest checkpoint, of step {newest}, is not a healthy one "
                "that verifies (a detector warned before it, or it is damaged), so the weights are those of step "
                f"{step}, the newest healthy one"
            )
        description = f"{init_from}, its checkpoint of step {step}"
        identity = state["config"]  # the run's identity record: its GPTConfig as a dict
        gpt_config = recorded_gpt_config(identity)
        return Source(gpt_config, state["model"], state["meta"]["tokenizer"], description, identity.get("data"))
    path = init_from
    if os.path.isdir(init_from):  # one file, or the shards an index names
        sharded = os.path.isfile(os.path.join(init_from, SHARD_INDEX))
        path = os.path.join(init_from, SHARD_INDEX if sharded else "model.safetensors")
    if not os.path.isfile(path) and os.path.isfile(os.path.join(init_from, "pytorch_model.bin")):
        raise UserError(
            f"--init_from {init_from} holds pytorch_model.bin only: a pickle, which can run code when loaded, so "
            "we do not read it. Re-save the model as safetensors: model.save_pretrained(folder) "
            "(safe_serialization, transformers' default)"
        )
    if not (os.path.isfile(path) and path.endswith((".safetensors", SHARD_INDEX))):
        raise UserError(
            f"--init_from {init_from!r} is none of: a run's out_dir (holding run.json and ckpt/), a Hugging Face GPT-2 "
            f"folder (model.safetensors and config.json), a .safetensors file, or one of {', '.join(NAMED_BASES)}"
        )
    state_dict = _read_hf_weights(path)
    config_path = os.path.join(os.path.dirname(path), "config.json")
    if not os.path.isfile(config_path):
        if "wpe.weight" not in state_dict:  # rotary positions: the heads, key/value heads and theta are not in it
            raise UserError(f"--init_from {init_from}: a Llama's weights need the config.json beside them")
        return Source(None, state_dict, None, init_from)
    try:
        with open(config_path) as f:
            gpt_config = gpt_config_from_hf(json.load(f))
    except (json.JSONDecodeError, UnicodeDecodeError, UserError) as e:  # not JSON, or neither GPT-2's nor Llama's
        raise UserError(f"{config_path}: {e}") from None
    # GPT-2's tokenizer is tiktoken's gpt2; a Llama's is its folder's own tokenizer.json (None: taken on trust)
    return Source(
        gpt_config, state_dict, "gpt2" if gpt_config.arch == "gpt2" else hf_tokenizer_of(init_from), init_from
    )


def _read_hf_weights(path):
    # its errors name the file
    tensors = read_safetensors_folder(os.path.dirname(path)) if path.endswith(SHARD_INDEX) else read_safetensors(path)
    try:
        return state_dict_from_hf(tensors)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None


def _shape_of(state_dict):
    """The GPTConfig fields a state dict shows by its shapes alone (n_head and the architecture it does not)."""
    vocab_size, n_embd = state_dict["wte.weight"].shape
    return dict(
        n_layer=count_blocks(state_dict, "blocks."),
        n_embd=n_embd,
        vocab_size=vocab_size,
        block_size=state_dict["wpe.weight"].shape[0],
    )


def fit_to_run(source_gpt_config, state_dict, run_gpt_config, source_description):
    """(the GPTConfig to build the run's model with, the state dict fitted to it), or a UserError naming
    what differs. The source's shape and architecture must be the run's, but for two things:
    - block_size may be smaller than the source's, never larger: GPT-2 keeps the first block_size rows of wpe;
      Llama's rotary positions have no table, so its tensors are kept whole.
    - vocab_size is the source's. HF's GPT-2 has 50257 rows where our runs pad to 50304; padding it with rows
      of zeros would score those ids logit 0, far above GPT-2's large negative logits, and hand them most of
      the probability. So the model is built with the source's rows, padded or not. Both must pad to the
      run's vocab_size (a run pads its tokenizer's vocabulary, padded_vocab_size): the same tokenizer.
    Without a source GPTConfig (a bare .safetensors file), what the tensors show is compared, and the rest
    (n_head; norm position, activation) is taken on trust."""
    if source_gpt_config is None:
        say(
            f"--init_from {source_description}: no config.json beside it, so its n_layer, n_embd, vocab_size and "
            "block_size are read from its tensors; n_head, norm_position and activation are this run's"
        )
        source = _shape_of(state_dict)  # a bare file shows only its tensors' shapes
    else:
        source = asdict(source_gpt_config)
    keys = ["n_layer", "n_head", "n_embd", *GPT2_ARCHITECTURE, "n_kv_head", "mlp_hidden", "rope_theta", "qkv_bias"]
    keys += ["norm_position"]  # an arm of a run of ours (arms.py): its blocks hold their norms elsewhere
    keys += ["rms_norm_eps"]
    differ = [key for key in keys if key in source and source[key] != getattr(run_gpt_config, key)]
    if source["block_size"] < run_gpt_config.block_size:
        differ.append("block_size")
    if differ:
        hint = " (a block_size up to the source's is fine)" if "block_size" in differ else ""
        raise UserError(
            f"--init_from {source_description} holds {', '.join(f'{k} {source[k]}' for k in differ)}; this run has "
            f"{', '.join(f'{k} {getattr(run_gpt_config, k)}' for k in differ)}: "
            f"pass {' '.join(flag_text(k, source[k]) for k in differ)}" + hint
        )
    padded = padded_vocab_size(run_gpt_config.vocab_size)  # the run's tokenizer's vocabulary, padded (it may be)
    if padded_vocab_size(source["vocab_size"]) != padded:
        raise UserError(
            f"--init_from {source_description} holds {source['vocab_size']} token rows; this run's tokenizer pads "
            f"to {padded}: train with the tokenizer these weights learned (--tokenizer)"
        )
    gpt_config = replace(run_gpt_config, vocab_size=source["vocab_size"])
    if source["block_size"] > run_gpt_config.block_size:
        shorter = (
            f"--init_from {source_description} holds {source['block_size']} positions; this run's block_size is "
            f"{run_gpt_config.block_size}: "
        )
        if gpt_config.arch == "gpt2":  # a learned table: its first block_size rows are the positions this run uses
            state_dict = {**state_dict, "wpe.weight": state_dict["wpe.weight"][: run_gpt_config.block_size]}
            say(shorter + f"its position table cropped to the first {run_gpt_config.block_size} rows")
        else:  # rotary positions are a formula of the position: a shorter block changes no tensor
            say(shorter + "its rotary positions need no table, so every tensor is kept as it is")
    with torch.device("meta"):  # the model's shapes, without memory or init
        expected = ArmedGPT(gpt_config).state_dict()
    for name, tensor in expected.items():
        if name not in state_dict:
            raise UserError(f"--init_from {source_description} has no tensor {name}, which this run's model has")
        if state_dict[name].shape != tensor.shape:
            raise UserError(
                f"--init_from {source_description}: {name} is {tuple(state_dict[name].shape)}; this run's model "
                f"needs {tuple(tensor.shape)}"
            )
    extra = sorted(state_dict.keys() - expected.keys())
    if extra:
        raise UserError(
            f"--init_from {source_description} holds tensors this run's model has none of ({', '.join(extra[:3])}): "
            "its architecture differs (--norm, --bias)"
        )
    return gpt_config, state_dict


# ----------------------------------------------------------------------------
# Out of a run: a folder transformers and lm-eval load

# tiktoken builds its gpt2 encoding from these two files (tiktoken_ext/openai_public.py), which are byte for byte
# Hugging Face's vocab.json and merges.txt. tiktoken.load.read_file_cached takes them from TIKTOKEN_CACHE_DIR,
# where tiktoken itself put them, so an export downloads nothing new.
GPT2_TOKENIZER_FILES = {
    "vocab.json": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    ),
    "merges.txt": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    ),
}


def _gpt2_tokenizer_file(url, sha256):
    from tiktoken.load import read_file_cached

    try:
        return read_file_cached(url, sha256)
    except Exception as e:  # requests' or tiktoken's own errors when offline
        raise UserError(
            f"GPT-2's tokenizer file {url} is not available offline ({type(e).__name__}: {e}). "
            "Point TIKTOKEN_CACHE_DIR at a folder holding tiktoken's cached files for gpt2"
        ) from None


def gpt2_tokenizer_contents(tokenizer, block_size):
    """{file name: bytes} of GPT-2's tokenizer as transformers reads it: tiktoken's cached vocab.json and merges.txt,
    and the two small files that name its class and its end-of-text token."""
    end_of_text = tokenizer.decode([tokenizer.eot])
    special_tokens = {"bos_token": end_of_text, "eos_token": end_of_text, "unk_token": end_of_text}
    tokenizer_config = {
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": block_size,
        "add_prefix_space": False,
        **special_tokens,
    }
    return {
        **{name: _gpt2_tokenizer_file(url, sha256) for name, (url, sha256) in GPT2_TOKENIZER_FILES.items()},
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2).encode(),
        "special_tokens_map.json": json.dumps(special_tokens, indent=2).encode(),
    }


# a base's own tokenizer, as save_pretrained writes it: an export carries those its run's tokenizer folder holds
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _is_our_export(folder):
    try:
        with open(os.path.join(folder, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    ours = config.get("exported_by") == EXPORTED_BY if isinstance(config, dict) else False
    return ours and config.get("model_type") in ("gpt2", "llama")


def export_hf(state_dict, gpt_config, tokenizer_name, dest_dir, max_shard_bytes=5 * 10**9):
    """Write our weights to dest_dir as a transformers GPT2LMHeadModel (a llama run: LlamaForCausalLM) with GPT-2's
    tokenizer: config.json, model.safetensors (fp32, the vocabulary trimmed to the tokenizer's), vocab.json,
    merges.txt, tokenizer_config.json, special_tokens_map.json (_write_into: each under a temporary name of its own,
    then renamed over its name). dest_dir is new, empty or an earlier export of ours; anything else is refused. Over an
    earlier export, only those six files are replaced: a file a user added there (lm-eval's results) is kept."""
    llama = gpt_config.arch == "llama"
    wanted = {**(LLAMA_ARCHITECTURE if llama else GPT2_ARCHITECTURE), "norm_position": "pre"}  # no arm (arms.py)
    gpt_config = ArmsConfig.of(gpt_config)
    differ = [key for key, value in wanted.items() if getattr(gpt_config, key) != value]
    if differ:
        has = ", ".join(
            f"{k}: {getattr(gpt_config, k)!r} ({'Llama' if llama else 'GPT-2'}: {wanted[k]!r})" for k in differ
        )
        raise UserError(
            f"--export_hf writes {'Llama' if llama else 'GPT-2'}'s architecture; this run has {has}: train with "
            + ("" if llama else "--preset gpt2-small or ")
            + " ".join(flag_text(k, wanted[k]) for k in differ)
        )
    # a tokenizer.json's folder (--tokenizer names the file or the folder); GPT-2's files come from tiktoken's cache
    folder = tokenizer_name if os.path.isdir(tokenizer_name) else os.path.dirname(tokenizer_name)
    hf_tokenizer_files = (
        [] if tokenizer_name == "gpt2" else [n for n in HF_TOKENIZER_FILES if os.path.isfile(os.path.join(folder, n))]
    )
    if tokenizer_name != "gpt2" and "tokenizer.json" not in hf_tokenizer_files:
        raise UserError(
            f"--export_hf needs GPT-2's tokenizer or a tokenizer.json (transformers and lm-eval read its files); "
            f"this run's tokenizer is {tokenizer_name!r}: train with --tokenizer gpt2, or a base's tokenizer.json"
        )
    dest_dir = os.path.normpath(dest_dir)
    replaceable = os.path.isdir(dest_dir) and (not os.listdir(dest_dir) or _is_our_export(dest_dir))
    if os.path.exists(dest_dir) and not replaceable:
        raise UserError(
            f"--export_hf {dest_dir} exists and is not an earlier export of ours: name a new or empty folder"
        )
    tokenizer = get_tokenizer(tokenizer_name)
    if llama:
        tensors = llama_state_dict_to_hf(state_dict, gpt_config, tokenizer.vocab_size)
        config = llama_hf_config(gpt_config, tokenizer.vocab_size, tokenizer.eot)
    else:
        tensors = state_dict_to_hf(state_dict, tokenizer.vocab_size)
        config = hf_config(gpt_config, tokenizer.vocab_size, tokenizer.eot)
    contents = {"config.json": json.dumps(config, indent=2).encode()}  # first: the mark a later export knows
    if hf_tokenizer_files:  # a base's own tokenizer files, carried along as they are
        for name in hf_tokenizer_files:
            with open(os.path.join(folder, name), "rb") as f:
                contents[name] = f.read()
    else:
        contents |= gpt2_tokenizer_contents(tokenizer, gpt_config.block_size)
    writers = {name: lambda f, content=content: f.write(content) for name, content in contents.items()}
    writers |= shard_writers(tensors, max_shard_bytes, metadata={"format": "pt"})
    made = not os.path.exists(dest_dir)
    os.makedirs(dest_dir, exist_ok=True)
    try:
        _write_into(dest_dir, writers)
    except BaseException:
        if made:  # the folder this export made, now empty again (rmdir removes nothing else)
            with contextlib.suppress(OSError):
                os.rmdir(dest_dir)
        raise
    ours = (SHARD_INDEX, "vocab.json", "merges.txt", *HF_TOKENIZER_FILES)  # what an earlier export of ours wrote
    for name in os.listdir(dest_dir):  # its weights in another number of files, another tokenizer's files: stale
        if name not in writers and (name in ours or re.fullmatch(r"model(-\d{5}-of-\d{5})?\.safetensors", name)):
            os.remove(os.path.join(dest_dir, name))
    kept = sorted(name for name in os.listdir(dest_dir) if name not in writers)
    n_params = sum(t.numel() for t in tensors.values())
    say(
        f"wrote {dest_dir}: a transformers {'Llama' if llama else 'GPT-2'} of {n_params:,} parameters (fp32, the "
        f"vocabulary trimmed to the tokenizer's {tokenizer.vocab_size}), with "
        + (f"its tokenizer's {', '.join(hf_tokenizer_files)}" if hf_tokenizer_files else "GPT-2's tokenizer files")
        + (f"; the folder's other files left as they were: {', '.join(kept)}" if kept else "")
    )


def _write_into(folder, writers):
    """Write each file of {name: write(f)} into folder, touching no other file there. Each is written whole under
    a temporary name of its own (a random one, opened "x": it never takes over a file it did not create), then
    all are renamed over their names at once, so a crash leaves the old files or the new ones but for that
    moment. If anything fails, the temporary files are removed, and nothing else."""
    temporary = {}
    try:
        for name, write in writers.items():
            path = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
            with open(path, "xb") as f:
                temporary[name] = path
                write(f)
                f.flush()
                os.fsync(f.fileno())
        for name, path in temporary.items():
            os.replace(path, os.path.join(folder, name))
    except BaseException:
        for path in temporary.values():
            files.remove_if_exists(path)
        raise
    files.fsync_dir(folder)


def export_run(out_dir, dest_dir, ckpt_step=-1, max_shard_mb=5000):
    """--export_hf: the run's checkpoint of ckpt_step (--ckpt_step; -1: its newest) exported to dest_dir (export_hf).
    The newest, not the newest that verifies as --sample and --eval_only read: an export leaves the run as its
    model, and a warning that it holds older weights would be read by no one. So when the newest checkpoint does
    not verify, the export is refused, naming the steps that do; --ckpt_step exports one of them."""
    ckpt_dir = os.path.join(out_dir, "ckpt")
    steps = checkpoint.list_steps(ckpt_dir)  # newest first
    if not steps:
        raise UserError(f"--export_hf: no checkpoint in {ckpt_dir}: train first (python train.py --out_dir ...)")
    try:
        step, state = checkpoint.load_chosen(ckpt_dir, steps[0] if ckpt_step == -1 else ckpt_step)
    except UserError as e:
        which = " exports the run's newest checkpoint, and" if ckpt_step == -1 else ":"
        raise UserError(f"--export_hf{which} {e}") from None
    say(f"exporting {out_dir}, its checkpoint of step {step}")
    gpt_config, tokenizer = recorded_gpt_config(state["config"]), state["meta"]["tokenizer"]
    export_hf(state["model"], gpt_config, tokenizer, dest_dir, max_shard_bytes=int(max_shard_mb * 10**6))
    say(f"score it on HellaSwag: lm_eval --model hf --model_args pretrained={dest_dir} --tasks hellaswag --device cpu")
