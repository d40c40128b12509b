"""Sampling: text from a trained model, the chapter's last look at a base model before it is called done.

    python train.py --sample --out_dir out/tiny --prompt "def " --num_samples 2

A run samples from its final weights when it ends (samples.txt; none with
--num_samples 0); `--sample` samples again from the newest checkpoint in
--out_dir (or the one of step --ckpt_step), printing each sample as
its tokens come (TextPrinter: only whole characters, also where a UTF-8
character spans byte or BPE tokens). Either way the model is a plain
single-device GPT, whatever layout trained it, and generates with its KV cache
unless --kv_cache false; --temperature (0: greedy), --top_k, then --top_p shape each draw.
"""

import functools
import os
import sys
from itertools import groupby

import torch

from machinery import checkpoint
from machinery.corpus import get_tokenizer
from model import GPT
from machinery.run_folder import out_dir_of, recorded_gpt_config

SEPARATOR = "\n<|endoftext|>\n"  # between the documents of a sample


def single_device_model(gpt_config, state_dict, device):
    """A plain GPT of gpt_config on one device from a single-device state dict, whatever layout trained it."""
    model = GPT(gpt_config).to(device)
    model.load_state_dict(state_dict)
    return model


def sample_texts(model, tokenizer, settings, device, stream=None):
    """num_samples continuations of the prompt; document boundaries shown as <|endoftext|>.

    stream (a text file, e.g. sys.stdout): draw the samples one after another instead of as one batch, and
    print each there as its tokens come, then a line of ==========; the texts returned are the ones printed."""
    if settings.num_samples == 0:  # --num_samples 0: no samples
        return []
    prompt = tokenizer.encode(settings.prompt) if settings.prompt else [tokenizer.eot]
    generate = functools.partial(
        model.generate,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_k=settings.top_k or None,  # 0: no top-k
        top_p=settings.top_p,
        kv_cache=settings.kv_cache,
    )
    model.eval()
    if stream is None:  # all at once, one row each: (num_samples, len(prompt) + max_new_tokens)
        rows = generate(torch.tensor([prompt] * settings.num_samples, dtype=torch.long, device=device)).tolist()
    else:
        rows = []
        for _ in range(settings.num_samples):
            printer = TextPrinter(tokenizer, settings.prompt, stream)
            out = generate(torch.tensor([prompt], dtype=torch.long, device=device), on_token=printer.add)
            printer.flush()  # the end: the text still pending
            stream.write(" \n==========\n")  # as print(text, "\n==========") separates them
            rows.append(out[0].tolist())
    model.train()
    return [sample_text(tokenizer, settings.prompt, row[len(prompt) :]) for row in rows]


def is_cut(tokenizer, token):
    """End-of-text ends a document; a padded-vocab id (never a target, rarely sampled) has no text either."""
    return token == tokenizer.eot or token >= tokenizer.vocab_size


def sample_text(tokenizer, prompt, tokens):
    """The prompt, then the sampled tokens' text, the documents between cuts joined by <|endoftext|>."""
    pieces = groupby(tokens, key=lambda t: is_cut(tokenizer, t))
    return prompt + SEPARATOR.join(tokenizer.decode(list(g)) for cut, g in pieces if not cut)


class TextPrinter:
    """Prints a sample's text as its tokens come, ending with exactly sample_text's text.

    A token need not end on a character: a byte token is one byte of a UTF-8 character up to four bytes long,
    and GPT-2's byte-level BPE splits rarer characters across tokens too. The tokens whose text is not yet
    complete wait in `pending`: their decode ends in U+FFFD, the replacement an unfinished character decodes
    to, and only the text before that is printed. UTF-8 is self-synchronizing, so text that decodes before an
    unfinished character never changes as more bytes come; and once the pending text ends on a whole character,
    the next token's bytes decode on their own. At a cut or the end, the rest is printed as decode has it
    (an unfinished character as U+FFFD)."""

    def __init__(self, tokenizer, prompt, out):
        self.tokenizer, self.out = tokenizer, out
        self.pending, self.shown = [], 0  # tokens whose text is not all printed; characters of it printed
        self.started = self.cut = False  # a document's text has begun; a cut came after it
        self.write(prompt)

    def add(self, token):  # a (1, 1) tensor from GPT.generate's on_token, or an int
        token = int(token)
        if is_cut(self.tokenizer, token):
            self.flush()
            self.cut = self.started
            return
        if self.cut:  # a document after a cut: the separator sample_text joins them with
            self.write(SEPARATOR)
            self.cut = False
        self.started = True
        self.pending.append(token)
        text = self.tokenizer.decode(self.pending)
        complete = text.rstrip("\ufffd")  # what follows may still be an unfinished character
        self.write(complete[self.shown :])
        self.shown = len(complete)
        if complete == text:  # ends on a whole character: the next token's bytes decode on their own
            self.pending, self.shown = [], 0

    def flush(self):  # a cut or the end: the pending text as it decodes now
        self.write(self.tokenizer.decode(self.pending)[self.shown :])
        self.pending, self.shown = [], 0

    def write(self, text):
        if text:
            self.out.write(text)
            self.out.flush()  # as it comes, even into a pipe


def sample(preset, configs, device):
    """--sample: print samples from the newest checkpoint in --out_dir (or out/<preset>), or --ckpt_step's, each as it
    comes."""
    torch.manual_seed(configs.train.seed)
    ckpt_dir = os.path.join(out_dir_of(preset, configs.train), "ckpt")
    latest = checkpoint.load_chosen(ckpt_dir, configs.recovery.ckpt_step, device)
    if latest is None:
        raise ValueError(f"no checkpoint in {ckpt_dir}: train first (python train.py --out_dir ...)")
    step, state = latest
    print(f"sampling from {checkpoint.step_path(ckpt_dir, step)}", file=sys.stderr)  # stdout: the samples alone
    model = single_device_model(recorded_gpt_config(state["config"]), state["model"], device)
    sample_texts(model, get_tokenizer(state["meta"]["tokenizer"]), configs.sample, device, stream=sys.stdout)
