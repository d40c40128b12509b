"""Sampling: text from a trained model, the chapter's last look at a base model before it is called done.

    python train.py --sample --out_dir out/tiny --prompt "def " --num_samples 2

A run samples from its final weights when it ends (samples.txt); `--sample`
samples again from the newest checkpoint in --out_dir. Either way the model is
a plain single-device GPT, whatever layout trained it.
"""

import os
from itertools import groupby

import torch

import checkpoint
from data import get_tokenizer
from model import GPT, GPTConfig
from run_folder import out_dir_of


def single_device_model(gpt_config, state_dict, device):
    """A plain GPT on one device from a single-device state dict, whatever layout trained it."""
    model = GPT(GPTConfig(**gpt_config)).to(device)
    model.load_state_dict(state_dict)
    return model


def sample_texts(model, tokenizer, settings, device):
    """num_samples continuations of the prompt; document boundaries shown as <|endoftext|>."""
    if settings.num_samples == 0:  # --num_samples 0: no samples
        return []
    prompt = tokenizer.encode(settings.prompt) if settings.prompt else [tokenizer.eot]
    idx = torch.tensor([prompt] * settings.num_samples, dtype=torch.long, device=device)  # (num_samples, len(prompt))
    model.eval()
    out = model.generate(idx, settings.max_new_tokens, temperature=settings.temperature, top_k=settings.top_k or None)
    model.train()
    texts = []
    for row in out[:, len(prompt) :].tolist():
        # cut at end-of-text; a padded-vocab id (never a target, rarely sampled) has no text either
        pieces = groupby(row, key=lambda t: t == tokenizer.eot or t >= tokenizer.vocab_size)
        texts.append(
            settings.prompt + "\n<|endoftext|>\n".join(tokenizer.decode(list(g)) for cut, g in pieces if not cut)
        )
    return texts


def sample(preset, configs, device):
    """--sample: print samples from the newest checkpoint in --out_dir (or out/<preset>)."""
    torch.manual_seed(configs.train.seed)
    ckpt_dir = os.path.join(out_dir_of(preset, configs.train), "ckpt")
    latest = checkpoint.load_latest(ckpt_dir, device)
    if latest is None:
        raise ValueError(f"no checkpoint in {ckpt_dir}: train first (python train.py --out_dir ...)")
    _, state = latest
    model = single_device_model(state["config"]["GPTConfig"], state["model"], device)
    for text in sample_texts(model, get_tokenizer(state["meta"]["tokenizer"]), configs.sample, device):
        print(text, "\n==========")
