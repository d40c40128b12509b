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
import torch.nn.functional as F

from errors import UserError
from machinery.components import checkpoint
from machinery.components.run_folder import out_dir_of, recorded_gpt_config
from machinery.corpora.corpus import get_tokenizer
from machinery.job.arms import ArmedGPT

SEPARATOR = "\n<|endoftext|>\n"  # between the documents of a sample

# ----------------------------------------------------------------------------
# Generating: the GPT's logits, a token at a time


class KVCache:
    """One layer's keys and values of every position generated so far, (B, H, S, C/H) each.

    A position's key and value depend only on it and the positions before it, so once computed they never
    change: generate keeps them, and each new token then needs one position's forward (its q, k, v and its
    attention over the S kept keys) instead of the whole context's again (Pope et al. 2022, "Efficiently
    Scaling Transformer Inference"). Only generation uses it; training sees every position at once."""

    def __init__(self):
        self.k = self.v = None  # (B, H, S, C/H) each; None before the first position

    def __len__(self):  # S, the positions held
        return 0 if self.k is None else self.k.size(2)

    def extend(self, k, v):
        """Append T new positions' keys and values, (B, H, T, C/H) each; return all S so far, the new ones last.
        Once it holds positions it takes one at a time: the attention kernels mask a query that sees every key
        (the newest position) or a square causal block, not T queries against S > T keys."""
        if self.k is not None and k.size(2) != 1:
            raise ValueError(f"a KV cache holding {len(self)} positions takes 1 new token at a time, not {k.size(2)}")
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        return self.k, self.v


def filter_top_p(logits, top_p):
    """Nucleus sampling (Holtzman et al. 2019, "The Curious Case of Neural Text Degeneration"): logits (B, V)
    with every token outside the nucleus set to -inf. The nucleus is the fewest most likely tokens whose
    probabilities sum to at least top_p; the most likely token is always in it."""
    probs, order = F.softmax(logits, dim=-1).sort(dim=-1, descending=True)  # (B, V), most likely first
    mass_before = probs.cumsum(dim=-1) - probs  # (B, V): the probability of the tokens ranked above each
    outside = mass_before >= top_p  # (B, V): the tokens above already reach top_p, the nucleus is complete
    outside = torch.empty_like(outside).scatter(-1, order, outside)  # (B, V): back in vocabulary order
    return logits.masked_fill(outside, -float("inf"))


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=1.0, kv_cache=True, on_token=None):
    """Extend idx (B, T0) by max_new_tokens tokens sampled from model (a single-device GPT) -> (B, T0 + max_new_tokens).

    Each token is drawn from the last position's logits / temperature, restricted first to the top_k most
    likely tokens (None: all), then to the nucleus of top_p among those (filter_top_p; 1.0: all); temperature
    0 is greedy: the most likely token, which both restrictions keep, drawing no random number. on_token,
    if given, gets each new (B, 1) column as soon as it is drawn (sample.py prints it).

    kv_cache keeps each layer's keys and values (KVCache): a new token then costs one position's forward
    instead of the whole context's, and the tokens drawn are the same. The context is its last block_size
    tokens. When it outgrows block_size, the cache is recomputed from the cropped context rather than slid
    along it: positions are learned and absolute, so cropping moves every kept token one position earlier,
    and every layer's keys above the first also mixed in the token that fell out. Past block_size each
    token thus costs a whole context's forward, with the cache or without."""
    if not 0 < top_p <= 1:
        raise UserError(f"top_p {top_p} must lie in (0, 1]: the probability mass to keep (1.0: all tokens)")
    if not temperature >= 0:
        raise UserError(f"temperature {temperature} must be 0 (greedy) or more")
    block_size, cache = model.config.block_size, None
    for _ in range(max_new_tokens):
        context = idx[:, -block_size:]
        if not kv_cache:  # the whole context again
            logits, _ = model(context)
        elif cache is None or len(cache[0]) == block_size:
            # the first token, or the newest one outgrew block_size: a new cache from the (cropped) context
            cache = [KVCache() for _ in model.blocks]  # one per layer
            logits, _ = model(context, cache=cache)
        else:  # one position's forward: the newest token against the kept keys and values
            logits, _ = model(idx[:, -1:], cache=cache)
        logits = logits[:, -1, :].float()  # (B, V)
        if temperature == 0:  # greedy
            next_token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        else:
            logits = logits / max(temperature, 1e-6)  # the floor keeps a tiny temperature's logits finite
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits[logits < kth] = -float("inf")
            if top_p < 1:
                logits = filter_top_p(logits, top_p)
            next_token = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)  # (B, 1)
        idx = torch.cat((idx, next_token), dim=1)
        if on_token is not None:
            on_token(next_token)
    return idx


# ----------------------------------------------------------------------------
# Text from a run


def single_device_model(gpt_config, state_dict, device):
    """A plain GPT of gpt_config on one device from a single-device state dict, whatever layout trained it."""
    model = ArmedGPT(gpt_config).to(device)
    model.load_state_dict(state_dict)
    return model


def sample_texts(model, tokenizer, settings, device, stream=None):
    """num_samples continuations of the prompt; document boundaries shown as <|endoftext|>.

    stream (a text file, e.g. sys.stdout): draw the samples one after another instead of as one batch, and
    print each there as its tokens come, then a line of ==========; the texts returned are the ones printed."""
    if settings.num_samples == 0:  # --num_samples 0: no samples
        return []
    prompt = tokenizer.encode(settings.prompt) if settings.prompt else [tokenizer.eot]
    draw = functools.partial(
        generate,
        model,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_k=settings.top_k or None,  # 0: no top-k
        top_p=settings.top_p,
        kv_cache=settings.kv_cache,
    )
    model.eval()
    if stream is None:  # all at once, one row each: (num_samples, len(prompt) + max_new_tokens)
        rows = draw(torch.tensor([prompt] * settings.num_samples, dtype=torch.long, device=device)).tolist()
    else:
        rows = []
        for _ in range(settings.num_samples):
            printer = TextPrinter(tokenizer, settings.prompt, stream)
            out = draw(torch.tensor([prompt], dtype=torch.long, device=device), on_token=printer.add)
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

    def add(self, token):  # a (1, 1) tensor from generate's on_token, or an int
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
        raise UserError(f"no checkpoint in {ckpt_dir}: train first (python train.py --out_dir ...)")
    step, state = latest
    print(f"sampling from {checkpoint.step_path(ckpt_dir, step)}", file=sys.stderr)  # stdout: the samples alone
    model = single_device_model(recorded_gpt_config(state["config"]), state["model"], device)
    sample_texts(model, get_tokenizer(state["meta"]["tokenizer"]), configs.sample, device, stream=sys.stdout)
