"""Tokenizing speed of the corpus preparation (machinery/corpora/corpus.py): MB/s for the byte and gpt2 tokenizers, one
worker against every core, and the peak memory of each run.

    python bench/prepare_speed.py [--mb 200] [--tokenizers byte,gpt2]

The corpus is synthetic English-like text (words drawn from a fixed list, in lines and
paragraphs), written once to a temporary folder as JSON Lines documents of ~4 KB. Each
preparation runs in a fresh process, so its peak resident memory is measured alone:
"peak MB" is the main process's peak plus its largest worker's. gpt2 needs tiktoken's files
(TIKTOKEN_CACHE_DIR offline).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = (
    "the of and to in is was that for it with as his on be at by had not are but from or have an they "
    "which one you were her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must through "
    "back years where much your way well down should because each just those people how too little"
).split()

RUN = r"""
import json, resource, sys, time
from machinery.corpora import corpus
t0 = time.perf_counter()
config = corpus.DataConfig(source=sys.argv[1], tokenizer=sys.argv[2], workers=int(sys.argv[3]))
meta = corpus.prepare(config, sys.argv[4])
seconds = time.perf_counter() - t0
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps(dict(seconds=seconds, tokens=meta["train_tokens"] + meta["val_tokens"], peak_mb=peak_kb / 1024)))
"""


def write_corpus(path, megabytes):
    rng, written = random.Random(0), 0
    with open(path, "w") as f:
        while written < megabytes * 1e6:
            lines = [
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))).capitalize() + "." for _ in range(40)
            ]
            line = json.dumps({"text": "\n".join(lines)}) + "\n"
            f.write(line)
            written += len(line)
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200, help="corpus size in MB")
    parser.add_argument("--tokenizers", default="byte,gpt2")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        size = write_corpus(corpus, args.mb)
        print(f"{size / 1e6:.0f} MB of JSON Lines, {cores} cores")
        print(
            f"{'tokenizer':<10} {'workers':>7} {'MB/s':>7} {'tokens':>12} {'seconds':>8} {'peak MB':>8} {'speed-up':>8}"
        )
        for tokenizer in args.tokenizers.split(","):
            single = None
            for workers in (1, cores):
                out = os.path.join(tmp, f"{tokenizer}-{workers}")
                result = subprocess.run(
                    [sys.executable, "-c", RUN, corpus, tokenizer, str(workers), out],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                if result.returncode:
                    sys.exit(f"preparing with {tokenizer}, {workers} workers failed:\n{result.stderr[-2000:]}")
                run = json.loads(result.stdout.strip().splitlines()[-1])
                rate = size / 1e6 / run["seconds"]
                single = single or rate
                print(
                    f"{tokenizer:<10} {workers:>7} {rate:>7.1f} {run['tokens']:>12,} {run['seconds']:>8.1f} "
                    f"{run['peak_mb']:>8.0f} {rate / single:>7.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
