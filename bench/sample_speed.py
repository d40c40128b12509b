"""Sampling speed with and without the KV cache: tokens/s of sample.generate, greedy, on the CPU.

    python bench/sample_speed.py [--new_tokens 256] [--repeats 2] [--threads 0]

Two shapes with random weights: the tiny preset's (4 layers, 4 heads, width 128, block 128, vocab 256)
and GPT-2 small's (12 layers, 12 heads, width 768, block 1024, vocab 50304, GPT-2's LayerNorm, biases and
tanh GELU). Each generates --new_tokens tokens from a 4-token prompt, batch 1, top_k 1 (greedy), with the
cache and re-running the whole context per token, after a short warm-up of both. A time is the fastest of
--repeats runs; all of it takes about 2 minutes on 2 cores, most of them GPT-2 small without the cache.
"same tokens" says whether the two drew the same tokens (they should; nothing is asserted).

The tiny shape's context outgrows its block of 128 after 124 new tokens: from there each token recomputes
the cache from the cropped context (machinery/components/sample.py, generate), which costs what no cache costs, so its
speedup is smaller. The last line is the GPT-2-small shape's speedup in this run.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery.components.sample import generate  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

SHAPES = {  # name -> GPTConfig fields; written out, so the bench needs no preset file
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=256),
    "GPT-2-small": dict(
        n_layer=12,
        n_head=12,
        n_embd=768,
        block_size=1024,
        vocab_size=50304,
        norm="layernorm",
        bias=True,
        activation="gelu_tanh",
    ),  # fmt: skip
}
PROMPT_TOKENS = 4


def timed_generate(model, prompt, new_tokens, kv_cache, repeats):
    """(tokens (1, T), seconds) of a greedy generation: the fastest of repeats runs (others' work on a shared
    machine only slows a run down)."""
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = generate(model, prompt, new_tokens, top_k=1, kv_cache=kv_cache)
        seconds.append(time.perf_counter() - t0)
    return out, min(seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each generation; the fastest counts")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0: torch's default")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"greedy sampling, {args.new_tokens} new tokens from a {PROMPT_TOKENS}-token prompt, batch 1, cpu, fp32, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    header = f"{'shape':<12} {'params':>7} {'kv cache':>8} {'tokens/s':>9} {'ms/token':>9} {'seconds':>8}"
    print(f"{header} {'same tokens':>11}")
    speedups = {}
    for name, fields in SHAPES.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(**fields)).eval()
        prompt = torch.randint(fields["vocab_size"], (1, PROMPT_TOKENS))
        for kv_cache in (True, False):  # warm-up: allocations, kernel choices
            generate(model, prompt, 4, top_k=1, kv_cache=kv_cache)
        cached, cached_s = timed_generate(model, prompt, args.new_tokens, True, args.repeats)
        uncached, uncached_s = timed_generate(model, prompt, args.new_tokens, False, args.repeats)
        same = "yes" if torch.equal(cached, uncached) else "NO"
        for label, seconds in (("on", cached_s), ("off", uncached_s)):
            print(
                f"{name:<12} {model.num_params() / 1e6:>6.1f}M {label:>8} {args.new_tokens / seconds:>9.1f} "
                f"{1e3 * seconds / args.new_tokens:>9.1f} {seconds:>8.1f} {same:>11}"
            )
        speedups[name] = uncached_s / cached_s
    print(f"kv cache speedup on the tiny shape: {speedups['tiny']:.1f}x")
    print(f"kv cache speedup on the GPT-2-small shape: {speedups['GPT-2-small']:.1f}x")


if __name__ == "__main__":
    main()
