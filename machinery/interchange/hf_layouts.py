"""Hugging Face's layouts of a GPT-2 and a Llama checkpoint, and ours: the parameter names each uses (GPT-2's Conv1D
matrices transposed; Llama's q/k/v and gate/up stacked into ours), the config.json of each family read into a
GPTConfig and written from one.
"""

import torch

from errors import UserError
from model import GPTConfig

# GPT-2's architecture in our GPTConfig's terms. nn.LayerNorm's eps 1e-5 is GPT-2's layer_norm_epsilon.
GPT2_ARCHITECTURE = dict(arch="gpt2", norm="layernorm", bias=True, activation="gelu_tanh", tie_embeddings=True)
# what a Llama export needs: Llama's norm without biases (q/k/v biases are Qwen2's, which LlamaConfig cannot say)
LLAMA_ARCHITECTURE = dict(norm="rmsnorm", bias=False, qkv_bias=False)

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


def count_blocks(names, prefix):
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
    for ours, theirs, transposed in _parameter_names(count_blocks(hf, "h.")):
        if theirs not in hf:
            raise UserError(f"no tensor {theirs} (or transformer.{theirs}): not a GPT2LMHeadModel's weights")
        tensor = hf.pop(theirs)
        state[ours] = (tensor.t().contiguous() if transposed else tensor).float()
    if hf:
        raise UserError(f"tensors that GPT-2's layout has none of: {', '.join(sorted(hf)[:5])}")
    if head is not None and not torch.equal(head.float(), state["wte.weight"]):
        raise UserError(
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
    for ours, theirs, transposed in _parameter_names(count_blocks(state_dict, "blocks.")):
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
            raise UserError(f"no tensor {theirs[present.index(False)]}: not a LlamaForCausalLM's weights")
        state[ours] = torch.cat([hf.pop(name) for name in theirs]).float()
    if hf:
        raise UserError(f"tensors that Llama's layout has none of: {', '.join(sorted(hf)[:5])}")
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
            raise UserError(f"config.json has {key} {value!r}; our GPT computes {' or '.join(map(repr, ours))}")
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
        raise UserError(f"config.json has model_type {hf_config.get('model_type')!r}: GPT-2 (gpt2) and Llama load")
    activations = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
    activation = hf_config.get("activation_function", "gelu_new")
    if activation not in activations:
        raise UserError(f"config.json has activation_function {activation!r}; we compute {', '.join(activations)}")
    missing = [key for key in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd") if key not in hf_config]
    if missing:
        raise UserError(f"config.json lacks {', '.join(missing)}")
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
            raise UserError(f"config.json has {key} {value!r}; our GPT computes {' or '.join(map(repr, ours))}")
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


def flag_text(key, value):
    """A config field as the command line takes it: --bias true, --n_layer 4."""
    return f"--{key} {str(value).lower() if isinstance(value, bool) else value}"
