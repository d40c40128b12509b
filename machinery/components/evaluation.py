"""Evaluation: how a model is judged. The val loss over the same rows every time, a small
benchmark (HellaSwag, Zellers et al. 2019: multiple choice scored by the model's own loss), and
the final check of a run that prints and logs both.

    python train.py --preset gpt2-small ...                     # the final check runs when training ends
    python train.py --preset gpt2-small --eval_only ...          # the same check of the newest checkpoint
    python train.py --benchmark hellaswag --benchmark_url file:///path/to/hellaswag_val.jsonl   # offline

A HellaSwag example is a context and four endings, one of them right ("A man is
on a roof. He ..."). A base model is never asked to answer: it reads context +
ending for each of the four, and its choice is the ending it finds least
surprising, as GPT-2 reproductions score it (no prompt, no few-shot examples).
Two readings of "least surprising":

    acc       the lowest summed loss over the ending's tokens: favours short endings
    acc_norm  the lowest mean loss per ending token: the ending's length divided out

Guessing scores 1/4. GPT-2 small (124M) scores about 0.29-0.30 acc_norm on the
10,042 validation examples (OpenAI's weights: 0.2955, scored this way by llm.c's
and build-nanogpt's hellaswag.py; bands/gpt2-small.json): the target of the
gpt2-small preset. A model too small to read English stays
near chance, and its acc then mostly says which ending is shortest.

The data is the public validation file, downloaded once and checked by sha256,
or any local file in its format (one JSON object per line with `ctx`, `endings`
and `label`), given as --benchmark path/to/file.jsonl.
"""

import json
import math
import os
import time

import torch
import torch.nn.functional as F

from errors import UserError
from machinery.components import checkpoint
from machinery.components.sample import single_device_model
from machinery.corpora.corpus import get_tokenizer
from machinery.job.cluster import say
from machinery.job.files import download
from parallel.grid import all_reduce_mean

# ----------------------------------------------------------------------------
# The val loss


@torch.no_grad()
def evaluate(model, stream, batches):
    """Mean loss over the first `batches` micro-batches of each rank's share of the stream,
    averaged over the DP ranks: the same rows every time, and the same rows for any layout
    that reads the same number of global batches. model is the model as this rank holds it."""
    model.module.eval()  # no dropout
    stream.load_state_dict({"position": 0})
    loss_sum = torch.zeros((), device=model.device)
    for _ in range(batches):
        x, y = stream.next_batch()
        loss_sum += model.loss(x.to(model.device), y.to(model.device)).float()
    model.module.train()
    return all_reduce_mean(loss_sum / batches, model.grid.dp_group, model.grid.dp).item()


# ----------------------------------------------------------------------------
# The benchmark: HellaSwag, scored by loss

HELLASWAG = dict(
    url="https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl",
    sha256="0aa3b88843990f3f10a97b9575c94d7b71fb2205240ba04ae4884d9e9c992588",  # 12,246,618 bytes, 10,042 lines
    filename="hellaswag_val.jsonl",
    offline_flags=("--benchmark", "--benchmark_url"),
)


def read_benchmark(bcfg):
    """--benchmark -> its examples (read_examples), downloaded first for `hellaswag`; [] for none."""
    if not bcfg.benchmark:
        return []
    return read_examples(benchmark_file(bcfg), bcfg.benchmark_examples)


def benchmark_file(bcfg):
    if bcfg.benchmark == "hellaswag":
        return download("hellaswag", bcfg.benchmark_dir, HELLASWAG, bcfg.benchmark_url or None)
    if os.path.isfile(bcfg.benchmark):
        return bcfg.benchmark
    raise UserError(
        f"--benchmark {bcfg.benchmark!r}: no such file. Give hellaswag (downloaded and checked), "
        "a local .jsonl file in its format (ctx, endings, label on each line), or '' for none"
    )


def read_examples(path, limit=0):
    """[(context, [ending, ...], label)] from a HellaSwag JSON Lines file, the first `limit` (0 = all)."""
    examples = []
    with open(path, "rb") as f:  # each line decoded by json.loads, so a line that is not UTF-8 is named too
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                examples.append((item["ctx"], list(item["endings"]), int(item["label"])))
            except (ValueError, KeyError, TypeError) as e:
                raise UserError(
                    f"{path} line {line_number}: not a HellaSwag example with ctx, endings and "
                    f"label ({type(e).__name__}: {e})"
                ) from None
            if not 0 <= examples[-1][2] < len(examples[-1][1]):
                raise UserError(
                    f"{path} line {line_number}: label {item['label']} is not an index into its "
                    f"{len(item['endings'])} endings"
                )
            if len(examples) == limit:
                break
    if not examples:
        raise UserError(f"{path} holds no examples")
    return examples


def render(context, endings, tokenizer, block_size):
    """One row of tokens per ending, context + " " + ending, and the index of the ending's first token.

    A row longer than the model's context keeps its last block_size + 1 tokens (the model reads
    block_size of them and predicts the last block_size): the ending is what is scored, so the
    context is what gets cut. The first token of a row has no prediction, so an ending never
    starts before index 1; an ending longer than the model's context loses its head too, and is
    scored on the tokens that remain."""
    context_tokens = tokenizer.encode(context)
    rows, starts = [], []
    for ending in endings:
        row = context_tokens + tokenizer.encode(" " + ending)
        cut = max(0, len(row) - (block_size + 1))
        rows.append(row[cut:])
        starts.append(max(1, len(context_tokens) - cut))
    return rows, starts


@torch.no_grad()
def ending_losses(model, rows, starts, device):
    """The summed and the mean loss of each row's ending tokens, each (R,) fp32.

    Rows are padded on the right: a causal model's loss at a position never sees what follows,
    so the padding changes nothing that is scored. Only the endings' positions go through the
    fp32 log-softmax over V, a fraction of the (R, T-1, V) logits."""
    T = max(len(row) for row in rows)
    tokens = torch.zeros(len(rows), T, dtype=torch.long)  # (R, T)
    scored = torch.zeros(len(rows), T - 1, dtype=torch.bool)  # (R, T-1): position t predicts token t+1
    for i, (row, start) in enumerate(zip(rows, starts)):
        tokens[i, : len(row)] = torch.tensor(row)
        scored[i, start - 1 : len(row) - 1] = True
    tokens, scored = tokens.to(device), scored.to(device)
    logits, _ = model(tokens[:, :-1])  # (R, T-1, V)
    losses = torch.zeros(scored.shape, device=device)  # (R, T-1), zero where nothing is scored
    losses[scored] = F.cross_entropy(logits[scored].float(), tokens[:, 1:][scored], reduction="none")
    summed = losses.sum(1)
    return summed, summed / scored.sum(1)


def benchmark_scores(model, tokenizer, examples, device, autocast, examples_per_batch=4):
    """acc, acc_norm and chance of model (a single-device GPT) on [(context, endings, label)];
    its progress said every half minute.

    A few examples per forward pass: their logits, (examples x endings, T, V), are the memory this
    costs, and with GPT-2's vocabulary 4 HellaSwag examples (16 rows of ~100-250 tokens) already
    take ~1 GB beside the model at the end of a run."""
    model.eval()
    correct, correct_norm, started, told = 0, 0, time.perf_counter(), time.perf_counter()
    for first in range(0, len(examples), examples_per_batch):
        batch = examples[first : first + examples_per_batch]
        rendered = [render(context, endings, tokenizer, model.config.block_size) for context, endings, _ in batch]
        rows = [row for rows, _ in rendered for row in rows]
        starts = [start for _, starts in rendered for start in starts]
        with autocast:
            summed, mean = (losses.tolist() for losses in ending_losses(model, rows, starts, device))
        offset = 0
        for _, endings, label in batch:
            ours = range(offset, offset + len(endings))
            correct += min(ours, key=summed.__getitem__) - offset == label  # the first of equal losses wins a tie
            correct_norm += min(ours, key=mean.__getitem__) - offset == label
            offset += len(endings)
        done = first + len(batch)
        if time.perf_counter() - told > 30 and done < len(examples):
            told, seconds = time.perf_counter(), time.perf_counter() - started
            eta = seconds * (len(examples) / done - 1)
            say(f"benchmark: {done:,} of {len(examples):,} examples, ETA {eta:.0f}s", flush=True)
    model.train()
    n = len(examples)
    return {
        "acc": correct / n,
        "acc_norm": correct_norm / n,
        "chance": sum(1 / len(e) for _, e, _ in examples) / n,
        "examples": n,
    }


# ----------------------------------------------------------------------------
# The final check


def final_check(model, step, val_loss, gpt_config, meta, benchmark_examples, eval_only=False):
    """Val loss and perplexity, and the benchmark, of the weights `model` holds (the model as this
    rank holds it, of single-device GPTConfig gpt_config; meta: its token files' meta.json),
    printed. Every rank calls it (the weights are gathered into single-device form); rank 0 scores
    the benchmark alone. Returns, on rank 0, the record for metrics.jsonl (marked `eval_only` when
    --eval_only asked for it, so it never passes for the end of the run) and the single-device
    model; elsewhere (None, None)."""
    say(
        f"step {step}, final check: val loss {val_loss:.4f}, perplexity {math.exp(val_loss):.2f} "
        f"(uniform guessing: {meta['vocab_size']})"
    )
    whole = checkpoint.full_state_dict(model)
    if model.grid.rank != 0:
        return None, None
    single = single_device_model(gpt_config, whole, model.device)
    record = {"step": step, "val_loss": val_loss, **({"eval_only": True} if eval_only else {})}
    if benchmark_examples:
        scores = benchmark_scores(
            single,
            get_tokenizer(meta["tokenizer"]),
            benchmark_examples,
            model.device,
            model.autocast,
        )
        record.update(hellaswag_acc_norm=scores["acc_norm"], hellaswag_acc=scores["acc"])
        print(
            f"benchmark: acc_norm {scores['acc_norm']:.4f}, acc {scores['acc']:.4f} on {scores['examples']:,} "
            f"HellaSwag-format examples (guessing scores {scores['chance']:.4f})",
            flush=True,
        )
    return record, single
