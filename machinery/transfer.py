"""Weights in and out of a run: safetensors files, Hugging Face's GPT-2 and Llama layouts, pretrained starts, exports.

    python train.py --preset gpt2-small --init_from gpt2 --source my_texts/   # start from OpenAI's GPT-2
    python train.py --export_hf out/hf --out_dir out/gpt2-run                 # a folder transformers and lm-eval load

In: `initial_weights` reads a run's out_dir (its newest healthy checkpoint), a
Hugging Face GPT-2 or Llama folder or .safetensors file, or a named base
(downloaded once, sha256-checked), and `fit_to_run` checks the weights fit the
run's model. Out: `export_hf` writes a run's weights as a transformers folder
(GPT2LMHeadModel or LlamaForCausalLM) with its tokenizer files, which
`lm_eval --model hf` scores.

safetensors is read and written here by code of our own (read_safetensors,
write_safetensors, a sharded folder's index): the format is an 8-byte
little-endian header length N, N bytes of JSON header ({name: {dtype, shape,
data_offsets}}, plus an optional "__metadata__" of strings), then the tensors'
raw little-endian bytes at those offsets. Writing it ourselves keeps the
run-time dependencies at torch, numpy, tiktoken and matplotlib, and shows that a
weights file is nothing more. (The tests check it against the safetensors package.)
"""

import contextlib
import json
import math
import os
import re
import struct
import urllib.request
import uuid
from dataclasses import asdict, replace
from typing import NamedTuple

import torch

from machinery import checkpoint
from machinery import files
from machinery.corpus import get_tokenizer
from model import GPT, GPTConfig, padded_vocab_size
from machinery.run_folder import recorded_gpt_config

# ----------------------------------------------------------------------------
# safetensors

SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
SAFETENSORS_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}


def read_safetensors(path):
    """{name: tensor} of a .safetensors file, on the CPU in the file's dtypes (the bytes are read as
    little-endian, as on every machine torch runs on)."""

    def malformed(problem):
        return ValueError(f"{path} is not a valid safetensors file: {problem}")

    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        if file_size < 8:
            raise malformed(f"{file_size} bytes, shorter than the 8-byte header length")
        (header_size,) = struct.unpack("<Q", f.read(8))
        if header_size > file_size - 8:
            raise malformed(f"its header length {header_size} runs past the end of the file ({file_size} bytes)")
        try:
            header = json.loads(f.read(header_size))
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise malformed(f"its header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise malformed("its header is not a JSON object")
        header.pop("__metadata__", None)
        data_start, data_size = 8 + header_size, file_size - 8 - header_size
        tensors = {}
        for name, entry in header.items():
            dtype, shape, begin, end = _tensor_entry(name, entry, data_size, malformed)
            f.seek(data_start + begin)
            buffer = bytearray(end - begin)
            f.readinto(buffer)
            # frombuffer shares the bytearray's memory: no second copy of the weights
            tensors[name] = (
                torch.frombuffer(buffer, dtype=dtype).reshape(shape) if buffer else torch.empty(shape, dtype=dtype)
            )
    return tensors


def _tensor_entry(name, entry, data_size, malformed):
    """(dtype, shape, begin, end) of one header entry, checked: a known dtype, and offsets that lie in
    the data and span exactly the bytes its shape needs."""
    if not isinstance(entry, dict):
        raise malformed(f"tensor {name}'s entry {entry!r} is not a JSON object")
    if entry.get("dtype") not in SAFETENSORS_DTYPES:
        raise malformed(
            f"tensor {name} has dtype {entry.get('dtype')!r}; this reader knows {', '.join(SAFETENSORS_DTYPES)}"
        )
    try:
        shape = [int(n) for n in entry["shape"]]
        begin, end = (int(n) for n in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise malformed(f"tensor {name}'s entry {entry} lacks a shape or a [begin, end] data_offsets") from None
    dtype = SAFETENSORS_DTYPES[entry["dtype"]]
    needed = math.prod(shape) * dtype.itemsize
    if not 0 <= begin <= end <= data_size or end - begin != needed:
        raise malformed(
            f"tensor {name} ({entry['dtype']} {shape}, {needed} bytes) has data_offsets [{begin}, {end}] "
            f"in a data section of {data_size} bytes"
        )
    return dtype, shape, begin, end


def write_safetensors(path, tensors, metadata=None):
    """Write {name: tensor} to path as safetensors (atomically: a reader finds the old file or the whole new
    one). metadata: {str: str}, the header's "__metadata__" (transformers looks for {"format": "pt"})."""
    files.write_atomic(path, safetensors_writer(tensors, metadata), mode="wb")


def safetensors_writer(tensors, metadata=None):
    """write(f): writes {name: tensor} as a safetensors file into f, opened "wb" (write_safetensors)."""
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    header, offset = ({"__metadata__": dict(metadata)} if metadata else {}), 0
    for name, tensor in tensors.items():
        if tensor.dtype not in SAFETENSORS_NAMES:
            raise ValueError(
                f"tensor {name} has dtype {tensor.dtype}; safetensors holds {', '.join(SAFETENSORS_DTYPES)}"
            )
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": SAFETENSORS_NAMES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # spaces up to a multiple of 8, as the reference pads it

    def write(f):
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for tensor in tensors.values():
            f.write(tensor.reshape(-1).view(torch.uint8).numpy())  # its raw bytes, in the machine's (little) endianness

    return write


# A large model's weights in several files: model-00001-of-0000N.safetensors, and model.safetensors.index.json
# whose "weight_map" names each tensor's file (Hugging Face's layout)
SHARD_INDEX = "model.safetensors.index.json"


def read_safetensors_folder(folder):
    """{name: tensor} of a folder's model.safetensors, or of every shard its model.safetensors.index.json names."""
    index = os.path.join(folder, SHARD_INDEX)
    if not os.path.isfile(index):
        return read_safetensors(os.path.join(folder, "model.safetensors"))
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]  # {tensor name: its shard's file name}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{index} is not a shard index (a JSON object with a weight_map): {e}") from None
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(read_safetensors(os.path.join(folder, shard)))
    if missing := sorted(set(weight_map) - set(tensors)):
        raise ValueError(f"{index} names tensors its shards do not hold: {', '.join(missing[:5])}")
    return tensors


def shard_writers(tensors, max_bytes, metadata=None):
    """{file name: write(f)} of tensors in as few files as hold at most max_bytes each (a larger tensor alone):
    model.safetensors when one file does, else the numbered shards and their index."""
    shards, size = [{}], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name], size = tensor, size + nbytes
    if len(shards) == 1:
        return {"model.safetensors": safetensors_writer(tensors, metadata)}
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": {t: n for n, s in zip(names, shards) for t in s}}
    writers = {name: safetensors_writer(shard, metadata) for name, shard in zip(names, shards)}
    return writers | {SHARD_INDEX: lambda f: f.write(json.dumps(index, indent=2).encode())}


# ----------------------------------------------------------------------------
# Hugging Face's GPT-2 layout <-> ours

# GPT-2's architecture in our GPTConfig's terms. nn.LayerNorm's eps 1e-5 is GPT-2's layer_norm_epsilon.
GPT2_ARCHITECTURE = dict(
    arch="gpt2", norm="layernorm", bias=True, norm_position="pre", activation="gelu_tanh", tie_embeddings=True
)
# what a Llama export needs: Llama's norm without biases (q/k/v biases are Qwen2's, which LlamaConfig cannot say)
LLAMA_ARCHITECTURE = dict(norm="rmsnorm", bias=False, norm_position="pre", qkv_bias=False)

# Every parameter of a block: our name, GPT2LMHeadModel's (under transformer.h.{i}.), and whether it is
# transposed. HF's GPT-2 builds its matrices as Conv1D, which stores a weight (in, out) and computes x @ W;
# our nn.Linear stores (out, in) and computes x @ W^T.
BLOCK_PARAMETERS = [
    ("norm_1.weight", "ln_1.weight", False),
    ("norm_1.bias", "ln_1.bias", False),
    ("attn.c_attn.weight", "attn.c_attn.weight", True),  # ours (3C, C), theirs (C, 3C): q, k, v side by side
    ("attn.c_attn.bias", "attn.c_attn.bias", False),
    ("attn.c_proj.weight", "attn.c_proj.weight", True),  # (C, C)
    ("attn.c_proj.bias", "attn.c_proj.bias", False),
    ("norm_2.weight", "ln_2.weight", False),
    ("norm_2.bias", "ln_2.bias", False),
    ("mlp.c_fc.weight", "mlp.c_fc.weight", True),  # ours (4C, C), theirs (C, 4C)
    ("mlp.c_fc.bias", "mlp.c_fc.bias", False),
    ("mlp.c_proj.weight", "mlp.c_proj.weight", True),  # ours (C, 4C), theirs (4C, C)
    ("mlp.c_proj.bias", "mlp.c_proj.bias", False),
]
OUTER_PARAMETERS = [
    ("wte.weight", "wte.weight", False),  # (V, C) both ways; also our tied lm_head.weight
    ("wpe.weight", "wpe.weight", False),  # (block_size, C)
    ("norm_f.weight", "ln_f.weight", False),
    ("norm_f.bias", "ln_f.bias", False),
]


def _parameter_names(n_layer):
    """(our name, HF's name without "transformer.", transposed) for every parameter of an n_layer GPT-2."""
    names = list(OUTER_PARAMETERS)
    for i in range(n_layer):
        names += [(f"blocks.{i}.{ours}", f"h.{i}.{theirs}", t) for ours, theirs, t in BLOCK_PARAMETERS]
    return names


def hf_folder_config(init_from):
    """The GPTConfig that the config.json of a Hugging Face folder describes (--init_from the folder, or a
    .safetensors file beside it), or a named base's, or None for any other --init_from (a run of ours, a bare file):
    the architecture a run from it takes (config.parse_args)."""
    if is_named_base(init_from):
        return NAMED_BASES[init_from].gpt_config
    if os.path.isfile(os.path.join(init_from, "run.json")):
        return None
    path = os.path.join(init_from if os.path.isdir(init_from) else os.path.dirname(init_from), "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return gpt_config_from_hf(json.load(f))
    except ValueError as e:  # not JSON, or neither GPT-2's nor Llama's
        raise ValueError(f"{path}: {e}") from None


def hf_tokenizer_of(init_from):
    """The folder of --init_from as a --tokenizer, where it holds a tokenizer.json (a base's own), or will once a
    named base is fetched; else None."""
    if is_named_base(init_from):
        return named_base_folder(init_from) if "tokenizer.json" in NAMED_BASES[init_from].files else None
    folder = os.path.abspath(init_from if os.path.isdir(init_from) else os.path.dirname(init_from))  # from any cwd
    return folder if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None


def _count_blocks(names, prefix):
    return len({name.split(".")[1] for name in names if name.startswith(prefix)})


def state_dict_from_hf(tensors):
    """Our state dict, in fp32 (our master weights), from a GPT2LMHeadModel's tensors (keys with or without
    "transformer.", the causal-mask buffers of old checkpoints ignored, the tied head filled from wte), or from a
    LlamaForCausalLM's (llama_state_dict_from_hf)."""
    if any(name.startswith("model.layers.") for name in tensors):
        return llama_state_dict_from_hf(tensors)
    hf = {
        name.removeprefix("transformer."): tensor
        for name, tensor in tensors.items()
        if not name.endswith((".attn.bias", ".attn.masked_bias"))  # buffers (the causal mask), not weights
    }
    head = hf.pop("lm_head.weight", None)  # tied to wte; save_pretrained usually leaves it out
    state = {}
    for ours, theirs, transposed in _parameter_names(_count_blocks(hf, "h.")):
        if theirs not in hf:
            raise ValueError(f"no tensor {theirs} (or transformer.{theirs}): not a GPT2LMHeadModel's weights")
        tensor = hf.pop(theirs)
        state[ours] = (tensor.t().contiguous() if transposed else tensor).float()
    if hf:
        raise ValueError(f"tensors that GPT-2's layout has none of: {', '.join(sorted(hf)[:5])}")
    if head is not None and not torch.equal(head.float(), state["wte.weight"]):
        raise ValueError(
            "lm_head.weight differs from wte.weight: an untied head, which our GPT (one tied matrix) cannot hold"
        )
    state["lm_head.weight"] = state["wte.weight"]  # the same tensor, as GPT's state_dict() lists it
    return state


def state_dict_to_hf(state_dict, vocab_size):
    """A GPT2LMHeadModel's tensors (named as save_pretrained names them, lm_head left out: it is tied) from our
    state dict. Only the first vocab_size rows of wte are kept: the tokenizer's real vocabulary, without the
    rows our runs pad it with."""
    rows = state_dict["wte.weight"].shape[0]
    if vocab_size > rows:
        raise ValueError(f"vocab_size {vocab_size} exceeds the {rows} rows of wte.weight")
    hf = {}
    for ours, theirs, transposed in _parameter_names(_count_blocks(state_dict, "blocks.")):
        if ours not in state_dict:
            raise ValueError(f"no {ours} in the state dict: GPT-2's layout needs it (biases and LayerNorm: --bias)")
        tensor = state_dict[ours][:vocab_size] if ours == "wte.weight" else state_dict[ours]
        hf[f"transformer.{theirs}"] = (tensor.t() if transposed else tensor).float().contiguous()
    return hf


# Llama's layout (LlamaForCausalLM as save_pretrained names it): nn.Linear on both sides, so nothing is transposed;
# our one q|k|v matrix is its q_proj, k_proj and v_proj stacked along the output features (k and v narrower under
# GQA), our one gate|up matrix its gate_proj and up_proj. Each entry: our name, theirs under model.layers.{i}.
LLAMA_BLOCK_PARAMETERS = [
    ("norm_1.weight", ["input_layernorm.weight"]),
    ("attn.c_attn.weight", ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"]),
    ("attn.c_attn.bias", ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]),  # Qwen2.5's
    ("attn.c_proj.weight", ["self_attn.o_proj.weight"]),
    ("norm_2.weight", ["post_attention_layernorm.weight"]),
    ("mlp.c_fc.weight", ["mlp.gate_proj.weight", "mlp.up_proj.weight"]),
    ("mlp.c_proj.weight", ["mlp.down_proj.weight"]),
]
LLAMA_OUTER_PARAMETERS = [
    ("wte.weight", ["model.embed_tokens.weight"]),
    ("norm_f.weight", ["model.norm.weight"]),
    ("lm_head.weight", ["lm_head.weight"]),  # absent where tied to the embedding
]


def _llama_parameter_names(n_layer):
    """(our name, [HF's names, stacked in this order]) for every parameter of an n_layer Llama."""
    names = list(LLAMA_OUTER_PARAMETERS)
    for i in range(n_layer):
        names += [
            (f"blocks.{i}.{ours}", [f"model.layers.{i}.{t}" for t in theirs]) for ours, theirs in LLAMA_BLOCK_PARAMETERS
        ]
    return names


def llama_state_dict_from_hf(tensors):
    """Our state dict, in fp32, from a LlamaForCausalLM's tensors: the separate projections stacked into ours, the
    q/k/v biases where it has them, a tied head (no lm_head.weight) filled from the embedding."""
    hf = {name: t for name, t in tensors.items() if not name.endswith("rotary_emb.inv_freq")}  # a buffer, not a weight
    state = {}
    n_layer = len({name.split(".")[2] for name in hf if name.startswith("model.layers.")})
    for ours, theirs in _llama_parameter_names(n_layer):
        present = [name in hf for name in theirs]
        if not any(present) and (ours.endswith("bias") or ours == "lm_head.weight"):
            continue  # optional: biases (Qwen2.5's), an untied head
        if not all(present):
            raise ValueError(f"no tensor {theirs[present.index(False)]}: not a LlamaForCausalLM's weights")
        state[ours] = torch.cat([hf.pop(name) for name in theirs]).float()
    if hf:
        raise ValueError(f"tensors that Llama's layout has none of: {', '.join(sorted(hf)[:5])}")
    state.setdefault("lm_head.weight", state["wte.weight"])  # tied: the same tensor, as GPT's state_dict() lists it
    return state


def llama_state_dict_to_hf(state_dict, gpt_config, vocab_size):
    """A LlamaForCausalLM's tensors from our state dict: our stacked matrices cut back into its projections, the
    vocabulary trimmed to the tokenizer's vocab_size rows, lm_head.weight only for an untied head."""
    C, hidden = gpt_config.n_embd, gpt_config.hidden
    kv = gpt_config.kv_heads * (C // gpt_config.n_head)
    sizes = {"attn.c_attn": [C, kv, kv], "mlp.c_fc": [hidden, hidden]}
    hf = {}
    for ours, theirs in _llama_parameter_names(gpt_config.n_layer):
        if ours not in state_dict or (ours == "lm_head.weight" and gpt_config.tie_embeddings):
            continue
        tensor = state_dict[ours][:vocab_size] if ours in ("wte.weight", "lm_head.weight") else state_dict[ours]
        module = ours.split(".", 2)[-1].rsplit(".", 1)[0]  # blocks.0.attn.c_attn.weight -> attn.c_attn
        pieces = tensor.split(sizes[module]) if len(theirs) > 1 else [tensor]
        hf.update({name: piece.float().contiguous() for name, piece in zip(theirs, pieces)})
    return hf


def llama_config_from_hf(hf_config):
    """Our GPTConfig (arch llama) of a Llama config.json (a dict); refuses what our GPT computes differently. RoPE's
    settings are read in both spellings: rope_theta, and rope_parameters as transformers 5 writes them."""
    rope = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling") or ({} if rope.get("rope_type", "default") == "default" else rope)
    computed_otherwise = {  # each: config.json's value, and what our GPT computes
        "hidden_act": (hf_config.get("hidden_act", "silu"), ("silu",)),
        "attention_bias": (hf_config.get("attention_bias", False), (False,)),  # Llama's puts one on o_proj too
        "mlp_bias": (hf_config.get("mlp_bias", False), (False,)),
        "rope_scaling": (scaling or None, (None,)),  # Llama 3.1's long-context scaling: not built
        "head_dim": (hf_config.get("head_dim"), (None, hf_config["hidden_size"] // hf_config["num_attention_heads"])),
    }
    for key, (value, ours) in computed_otherwise.items():
        if value not in ours:
            raise ValueError(f"config.json has {key} {value!r}; our GPT computes {' or '.join(map(repr, ours))}")
    return GPTConfig(
        arch="llama",
        block_size=hf_config["max_position_embeddings"],
        vocab_size=hf_config["vocab_size"],
        n_layer=hf_config["num_hidden_layers"],
        n_head=hf_config["num_attention_heads"],
        n_kv_head=hf_config.get("num_key_value_heads") or hf_config["num_attention_heads"],
        n_embd=hf_config["hidden_size"],
        mlp_hidden=hf_config["intermediate_size"],
        rope_theta=float(hf_config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_norm_eps=hf_config.get("rms_norm_eps", 1e-6),
        tie_embeddings=hf_config.get("tie_word_embeddings", False),  # LlamaConfig's default: untied
    )


def llama_hf_config(gpt_config, vocab_size, eot_id):
    """config.json of a LlamaForCausalLM with our model's shape, as transformers loads it."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "max_position_embeddings": gpt_config.block_size,
        "hidden_size": gpt_config.n_embd,
        "intermediate_size": gpt_config.hidden,
        "num_hidden_layers": gpt_config.n_layer,
        "num_attention_heads": gpt_config.n_head,
        "num_key_value_heads": gpt_config.kv_heads,
        "head_dim": gpt_config.n_embd // gpt_config.n_head,
        "hidden_act": "silu",
        "rms_norm_eps": gpt_config.rms_norm_eps,
        "rope_theta": gpt_config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": gpt_config.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "tie_word_embeddings": gpt_config.tie_embeddings,
        "use_cache": True,
        "dtype": "float32",
        "exported_by": EXPORTED_BY,
    }


def gpt_config_from_hf(hf_config):
    """Our GPTConfig of a GPT-2 (or a Llama: llama_config_from_hf) config.json (a dict); refuses what our GPT
    computes differently."""
    if hf_config.get("model_type") == "llama":
        return llama_config_from_hf(hf_config)
    if hf_config.get("model_type") != "gpt2":
        raise ValueError(f"config.json has model_type {hf_config.get('model_type')!r}: GPT-2 (gpt2) and Llama load")
    activations = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
    activation = hf_config.get("activation_function", "gelu_new")
    if activation not in activations:
        raise ValueError(f"config.json has activation_function {activation!r}; we compute {', '.join(activations)}")
    missing = [key for key in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd") if key not in hf_config]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    n_embd = hf_config["n_embd"]
    computed_otherwise = {  # each: config.json's value, and the value our GPT computes
        "n_inner": (hf_config.get("n_inner"), (None, 4 * n_embd)),
        "layer_norm_epsilon": (hf_config.get("layer_norm_epsilon", 1e-5), (1e-5,)),
        "scale_attn_weights": (hf_config.get("scale_attn_weights", True), (True,)),
        "scale_attn_by_inverse_layer_idx": (hf_config.get("scale_attn_by_inverse_layer_idx", False), (False,)),
        "reorder_and_upcast_attn": (hf_config.get("reorder_and_upcast_attn", False), (False,)),
    }
    for key, (value, ours) in computed_otherwise.items():
        if value not in ours:
            raise ValueError(f"config.json has {key} {value!r}; our GPT computes {' or '.join(map(repr, ours))}")
    return GPTConfig(
        block_size=hf_config["n_positions"],
        vocab_size=hf_config["vocab_size"],
        n_layer=hf_config["n_layer"],
        n_head=hf_config["n_head"],
        n_embd=n_embd,
        **{**GPT2_ARCHITECTURE, "activation": activations[activation]},
    )


EXPORTED_BY = "minipretrain"  # marks a config.json as ours: a later export may replace the files it wrote


def hf_config(gpt_config, vocab_size, eot_id):
    """config.json of a GPT2LMHeadModel with our model's shape, as transformers 5 loads it. No dropout:
    the weights are for evaluation and fine-tuning, which set their own."""
    block_size = gpt_config.block_size
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab_size,
        "n_positions": block_size,
        "n_ctx": block_size,
        "n_embd": gpt_config.n_embd,
        "n_layer": gpt_config.n_layer,
        "n_head": gpt_config.n_head,
        "n_inner": None,  # 4 n_embd
        "activation_function": {"gelu_tanh": "gelu_new", "gelu": "gelu"}[gpt_config.activation],
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "tie_word_embeddings": True,
        "use_cache": True,
        "dtype": "float32",
        "exported_by": EXPORTED_BY,
    }


def _flag(key, value):
    """A config field as the command line takes it: --bias true, --n_layer 4."""
    return f"--{key} {str(value).lower() if isinstance(value, bool) else value}"


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


def is_named_base(init_from):
    """A path that exists wins over a name: `git clone .../gpt2` makes a folder called gpt2."""
    return init_from in NAMED_BASES and not os.path.exists(init_from)


def named_base_folder(name):
    return os.path.abspath(os.path.join(NAMED_WEIGHTS_DIR, name))  # absolute: a --tokenizer read from any cwd


def fetch_named_base(name, init_url="", say=print):
    """The folder holding a named base's files, fetched once (from --init_url, a folder's URL, if given) and each
    checked against its sha256: the pinned one, or where none was published, the one the hub gives for that
    revision's file (said so). A file that is there took its name only after its check (files.download)."""
    base = NAMED_BASES[name]
    if init_url.endswith(tuple(base.files)):
        raise ValueError(
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
        raise ValueError(
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


def initial_weights(init_from, init_url="", say=print):
    """The Source of --init_from, which is one of:
    - a run's out_dir: its newest healthy checkpoint;
    - a Hugging Face GPT-2 or Llama folder: its model.safetensors (or shards), and the config.json beside it;
    - a .safetensors file in GPT-2's layout (its config.json, if one lies beside it);
    - a name in NAMED_BASES: fetched once into data/weights/<name>/ (from --init_url if given), then read as a
      folder, where GPT-2's holds the weights only (its architecture is GPT2_ARCHITECTURE, its tokenizer tiktoken's)."""
    if is_named_base(init_from):
        base = NAMED_BASES[init_from]
        folder = fetch_named_base(init_from, init_url, say)
        weights = _read_hf_weights(os.path.join(folder, "model.safetensors"))
        gpt2 = base.gpt_config.arch == "gpt2"
        gpt_config, tokenizer = (base.gpt_config, "gpt2") if gpt2 else (hf_folder_config(folder), folder)
        return Source(gpt_config, weights, tokenizer, f"{init_from} (at {base.revision[:12]})")
    if os.path.isfile(os.path.join(init_from, "run.json")):  # a run of ours
        ckpt_dir = os.path.join(init_from, "ckpt")
        latest = checkpoint.load_latest(ckpt_dir, healthy_only=True, warn=say)
        if latest is None:
            raise ValueError(
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
        raise ValueError(
            f"--init_from {init_from} holds pytorch_model.bin only: a pickle, which can run code when loaded, so "
            "we do not read it. Re-save the model as safetensors: model.save_pretrained(folder) "
            "(safe_serialization, transformers' default)"
        )
    if not (os.path.isfile(path) and path.endswith((".safetensors", SHARD_INDEX))):
        raise ValueError(
            f"--init_from {init_from!r} is none of: a run's out_dir (holding run.json and ckpt/), a Hugging Face GPT-2 "
            f"folder (model.safetensors and config.json), a .safetensors file, or one of {', '.join(NAMED_BASES)}"
        )
    state_dict = _read_hf_weights(path)
    config_path = os.path.join(os.path.dirname(path), "config.json")
    if not os.path.isfile(config_path):
        if "wpe.weight" not in state_dict:  # rotary positions: the heads, key/value heads and theta are not in it
            raise ValueError(f"--init_from {init_from}: a Llama's weights need the config.json beside them")
        return Source(None, state_dict, None, init_from)
    try:
        with open(config_path) as f:
            gpt_config = gpt_config_from_hf(json.load(f))
    except ValueError as e:  # not JSON, or neither GPT-2's nor Llama's
        raise ValueError(f"{config_path}: {e}") from None
    # GPT-2's tokenizer is tiktoken's gpt2; a Llama's is its folder's own tokenizer.json (None: taken on trust)
    return Source(
        gpt_config, state_dict, "gpt2" if gpt_config.arch == "gpt2" else hf_tokenizer_of(init_from), init_from
    )


def _read_hf_weights(path):
    # its errors name the file
    tensors = read_safetensors_folder(os.path.dirname(path)) if path.endswith(SHARD_INDEX) else read_safetensors(path)
    try:
        return state_dict_from_hf(tensors)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _shape_of(state_dict):
    """The GPTConfig fields a state dict shows by its shapes alone (n_head and the architecture it does not)."""
    vocab_size, n_embd = state_dict["wte.weight"].shape
    return dict(
        n_layer=_count_blocks(state_dict, "blocks."),
        n_embd=n_embd,
        vocab_size=vocab_size,
        block_size=state_dict["wpe.weight"].shape[0],
    )


def fit_to_run(source_gpt_config, state_dict, run_gpt_config, source_description, say=print):
    """(the GPTConfig to build the run's model with, the state dict fitted to it), or a ValueError naming
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
    keys += ["rms_norm_eps"]
    differ = [key for key in keys if key in source and source[key] != getattr(run_gpt_config, key)]
    if source["block_size"] < run_gpt_config.block_size:
        differ.append("block_size")
    if differ:
        hint = " (a block_size up to the source's is fine)" if "block_size" in differ else ""
        raise ValueError(
            f"--init_from {source_description} holds {', '.join(f'{k} {source[k]}' for k in differ)}; this run has "
            f"{', '.join(f'{k} {getattr(run_gpt_config, k)}' for k in differ)}: "
            f"pass {' '.join(_flag(k, source[k]) for k in differ)}" + hint
        )
    padded = padded_vocab_size(run_gpt_config.vocab_size)  # the run's tokenizer's vocabulary, padded (it may be)
    if padded_vocab_size(source["vocab_size"]) != padded:
        raise ValueError(
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
        expected = GPT(gpt_config).state_dict()
    for name, tensor in expected.items():
        if name not in state_dict:
            raise ValueError(f"--init_from {source_description} has no tensor {name}, which this run's model has")
        if state_dict[name].shape != tensor.shape:
            raise ValueError(
                f"--init_from {source_description}: {name} is {tuple(state_dict[name].shape)}; this run's model "
                f"needs {tuple(tensor.shape)}"
            )
    extra = sorted(state_dict.keys() - expected.keys())
    if extra:
        raise ValueError(
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
        raise ValueError(
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


def export_hf(state_dict, gpt_config, tokenizer_name, dest_dir, say=print, max_shard_bytes=5 * 10**9):
    """Write our weights to dest_dir as a transformers GPT2LMHeadModel (a llama run: LlamaForCausalLM) with GPT-2's
    tokenizer: config.json, model.safetensors (fp32, the vocabulary trimmed to the tokenizer's), vocab.json,
    merges.txt, tokenizer_config.json, special_tokens_map.json (_write_into: each under a temporary name of its own,
    then renamed over its name). dest_dir is new, empty or an earlier export of ours; anything else is refused. Over an
    earlier export, only those six files are replaced: a file a user added there (lm-eval's results) is kept."""
    llama = gpt_config.arch == "llama"
    wanted = LLAMA_ARCHITECTURE if llama else GPT2_ARCHITECTURE
    differ = [key for key, value in wanted.items() if getattr(gpt_config, key) != value]
    if differ:
        has = ", ".join(
            f"{k}: {getattr(gpt_config, k)!r} ({'Llama' if llama else 'GPT-2'}: {wanted[k]!r})" for k in differ
        )
        raise ValueError(
            f"--export_hf writes {'Llama' if llama else 'GPT-2'}'s architecture; this run has {has}: train with "
            + ("" if llama else "--preset gpt2-small or ")
            + " ".join(_flag(k, wanted[k]) for k in differ)
        )
    # a tokenizer.json's folder (--tokenizer names the file or the folder); GPT-2's files come from tiktoken's cache
    folder = tokenizer_name if os.path.isdir(tokenizer_name) else os.path.dirname(tokenizer_name)
    hf_tokenizer_files = (
        [] if tokenizer_name == "gpt2" else [n for n in HF_TOKENIZER_FILES if os.path.isfile(os.path.join(folder, n))]
    )
    if tokenizer_name != "gpt2" and "tokenizer.json" not in hf_tokenizer_files:
        raise ValueError(
            f"--export_hf needs GPT-2's tokenizer or a tokenizer.json (transformers and lm-eval read its files); "
            f"this run's tokenizer is {tokenizer_name!r}: train with --tokenizer gpt2, or a base's tokenizer.json"
        )
    dest_dir = os.path.normpath(dest_dir)
    replaceable = os.path.isdir(dest_dir) and (not os.listdir(dest_dir) or _is_our_export(dest_dir))
    if os.path.exists(dest_dir) and not replaceable:
        raise ValueError(
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


def export_run(out_dir, dest_dir, ckpt_step=-1, say=print, max_shard_mb=5000):
    """--export_hf: the run's checkpoint of ckpt_step (--ckpt_step; -1: its newest) exported to dest_dir (export_hf).
    The newest, not the newest that verifies as --sample and --eval_only read: an export leaves the run as its
    model, and a warning that it holds older weights would be read by no one. So when the newest checkpoint does
    not verify, the export is refused, naming the steps that do; --ckpt_step exports one of them."""
    ckpt_dir = os.path.join(out_dir, "ckpt")
    steps = checkpoint.list_steps(ckpt_dir)  # newest first
    if not steps:
        raise ValueError(f"--export_hf: no checkpoint in {ckpt_dir}: train first (python train.py --out_dir ...)")
    try:
        step, state = checkpoint.load_chosen(ckpt_dir, steps[0] if ckpt_step == -1 else ckpt_step)
    except ValueError as e:
        which = " exports the run's newest checkpoint, and" if ckpt_step == -1 else ":"
        raise ValueError(f"--export_hf{which} {e}") from None
    say(f"exporting {out_dir}, its checkpoint of step {step}")
    gpt_config, tokenizer = recorded_gpt_config(state["config"]), state["meta"]["tokenizer"]
    export_hf(state["model"], gpt_config, tokenizer, dest_dir, say, max_shard_bytes=int(max_shard_mb * 10**6))
    say(f"score it on HellaSwag: lm_eval --model hf --model_args pretrained={dest_dir} --tasks hellaswag --device cpu")
