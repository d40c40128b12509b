"""Corpus -> pre-tokenized token files (train.bin, val.bin, meta.json: the format data.py reads), once.

Training never tokenizes on the fly: a corpus is tokenized once into two flat binary files of token ids plus
meta.json, which data.TokenStream then reads through a memory map, walking the file in order.

    python -m machinery.corpus --source stdlib --tokenizer byte --out_dir data/stdlib-byte
    python -m machinery.corpus --source shakespeare --tokenizer gpt2 --out_dir data/shakespeare-gpt2
    python -m machinery.corpus --source 'my_corpus/**/*.txt' --tokenizer byte --out_dir data/mine
    python -m machinery.corpus --source corpus.jsonl.gz --text_field text --tokenizer gpt2 --out_dir data/web

Sources: `stdlib` (the Python standard library's own source text: needs no
network), `shakespeare` (Tiny Shakespeare, downloaded once and checked against
its sha256), or any local file, folder or glob. A text file is one document; a
JSON Lines file (`.jsonl`, `.jsonl.gz`) holds one document per line, its text
under --text_field. Tokenizers: `byte` (UTF-8 bytes, vocab 256), any tiktoken
encoding name (`gpt2`, `cl100k_base`, ...), or a Hugging Face tokenizer.json.
"""

import argparse
import glob
import gzip
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import sys
import sysconfig
import time
from dataclasses import dataclass

import numpy as np

from data import load_meta, read_json, token_dtype
from errors import UserError
from machinery.job.files import download, file_sha256, remove_if_exists, write_json_atomic

# ----------------------------------------------------------------------------
# Tokenizers: encode(text) -> ids, decode(ids) -> text, an end-of-text id


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 256, nothing to download.

    The end-of-text separator is byte 0 (NUL): UTF-8 produces 0x00 only for the
    NUL character itself, which text corpora do not contain.
    """

    name = "byte"
    vocab_size = 256
    eot = 0

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


class TiktokenTokenizer:
    """Any tiktoken encoding (GPT-2 BPE is `gpt2`); its own end-of-text token."""

    def __init__(self, name):
        import tiktoken

        if name not in tiktoken.list_encoding_names():
            raise UserError(
                f"unknown tokenizer {name!r}: use 'byte', a tiktoken encoding ("
                + ", ".join(tiktoken.list_encoding_names())
                + "), or the path of a tokenizer.json (or of a folder holding one)"
            )
        try:
            self.encoding = tiktoken.get_encoding(name)
        except Exception as e:  # tiktoken raises requests' or its own errors when offline
            raise UserError(
                f"tokenizer {name!r} is not available offline ({type(e).__name__}: {e}). tiktoken downloads its "
                "files once and keeps them in the folder TIKTOKEN_CACHE_DIR names (unset: data-gym-cache in the "
                "system's temp folder): run once with network, with TIKTOKEN_CACHE_DIR set to a folder that lasts, or "
                "copy that folder from a machine where it holds them and point TIKTOKEN_CACHE_DIR at the copy; "
                "or use --tokenizer byte, which needs no download."
            ) from None
        self.name = name
        self.vocab_size = self.encoding.n_vocab
        self.eot = self.encoding.eot_token

    def encode(self, text):
        return self.encoding.encode_ordinary(text)

    def decode(self, ids):
        return self.encoding.decode(list(ids))


class HFTokenizer:
    """A Hugging Face tokenizer.json (the file, or a folder holding one: a base model's own tokenizer), read by the
    `tokenizers` package, imported only here. Special tokens written in the text (`<|endoftext|>`) become their ids,
    as Hugging Face encodes them (tiktoken's `encode_ordinary` above reads them as plain text). Its end-of-text id:
    the first of END_OF_TEXT it holds."""

    END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>")

    def __init__(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError(f"--tokenizer {path}: a tokenizer.json is read with tokenizers: pip install tokenizers")
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise UserError(f"--tokenizer {path}: no tokenizer.json there (a file, or a folder holding one)")
        self.tokenizer = Tokenizer.from_file(file)
        self.name = path
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        ids = [self.tokenizer.token_to_id(token) for token in self.END_OF_TEXT]
        if all(i is None for i in ids):
            raise UserError(f"--tokenizer {path}: none of {', '.join(self.END_OF_TEXT)} in its vocabulary")
        self.eot = next(i for i in ids if i is not None)

    def encode(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False).ids  # no BOS: documents end with eot instead

    def decode(self, ids):
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def get_tokenizer(name):
    """byte, a tiktoken encoding's name, or the path of a tokenizer.json (or of a folder holding one)."""
    if name == "byte":
        return ByteTokenizer()
    import tiktoken

    # a tiktoken name first: a folder that happens to be called gpt2 does not change what --tokenizer gpt2 means
    if name not in tiktoken.list_encoding_names() and (os.path.exists(name) or name.endswith(".json")):
        return HFTokenizer(name)
    return TiktokenTokenizer(name)


# ----------------------------------------------------------------------------
# Sources: a corpus is a deterministic, ordered list of documents (text files)

# Tiny Shakespeare, as published with Karpathy's char-rnn.
DOWNLOADS = {
    "shakespeare": dict(
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        filename="tinyshakespeare.txt",
        offline_flags=("--source", "--url"),  # how a user without network hands over a local copy
    ),
}
NAMED_SOURCES = ["stdlib", *DOWNLOADS]


def stdlib_files():
    """The interpreter's standard library: its .py sources, test suites left out.

    pydoc_data/topics.py (the text of `help()` topics) is one of them. Sorted by
    relative path, so every machine with the same Python builds the same corpus.
    """
    root = sysconfig.get_paths()["stdlib"]
    skip = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in skip]
        files += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    return sorted(files, key=lambda f: os.path.relpath(f, root))


def resolve_source(source, data_dir, url=None):
    """--source -> (ordered list of document paths, a short description)."""
    if source == "stdlib":
        return stdlib_files(), f"stdlib of Python {sys.version.split()[0]}"
    if source in DOWNLOADS:
        return [download(source, data_dir, DOWNLOADS[source], url)], f"{source} ({DOWNLOADS[source]['sha256'][:12]})"
    if os.path.isfile(source):
        return [source], os.path.abspath(source)
    if os.path.isdir(source):
        files = [os.path.join(d, n) for d, _, names in os.walk(source) for n in names]
    else:
        files = glob.glob(source, recursive=True)
    files = sorted(f for f in files if os.path.isfile(f) and not os.path.basename(f).startswith("."))
    if not files:
        raise UserError(
            f"--source {source!r}: no such file or folder, and no file matches it as a glob. "
            f"Give a text file, a folder, a glob, or one of: {', '.join(NAMED_SOURCES)}"
        )
    return files, os.path.abspath(source)


def corpus_sha256(files):
    """One hash over every document's bytes and its order: it names the corpus."""
    h = hashlib.sha256()
    for path in files:
        h.update(file_sha256(path).encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------
# Preparation: documents -> train.bin, val.bin, meta.json


@dataclass
class DataConfig:
    source: str = "stdlib"  # stdlib | shakespeare | a text or JSON Lines file, folder or glob
    tokenizer: str = "byte"  # byte | a tiktoken encoding name (gpt2, ...) | a tokenizer.json, or a folder holding one
    val_fraction: float = 0.1  # the last tenth of the token stream is held out for validation
    url: str = ""  # download mirror for a named source (a file:// URL works); empty = the usual one
    text_field: str = "text"  # JSON Lines sources: the field of each line that holds its document's text
    workers: int = 0  # tokenizing processes; 0 = one per core


def prepare(config, data_dir, overwrite=False, chunk_chars=1 << 22, shard_chars=1 << 24):
    """Tokenize the corpus into data_dir once; return its meta dict.

    The documents are read in order, in pieces of about chunk_chars characters (cut
    at line ends), and grouped into shards of about shard_chars. Worker processes
    (--workers, default: every core) tokenize the shards, a few at a time, so memory
    stays bounded whatever the corpus size. Each finished shard is renamed into
    place with its counts, so a prepare that is killed and run again tokenizes only
    the shards it had not finished, and produces the same bytes. The shards are
    then joined into train.bin and val.bin under temporary names, renamed at the
    end, meta.json last: a crash leaves the previous data (or none), never
    half-written files. The same inputs again are a no-op.
    """
    if not 0 < config.val_fraction < 1:
        raise UserError(f"--val_fraction {config.val_fraction} must lie strictly between 0 and 1")
    if config.workers < 0:
        raise UserError(f"--workers {config.workers} must be 0 (every core) or more")
    os.makedirs(data_dir, exist_ok=True)
    files, description = resolve_source(config.source, data_dir, config.url or None)
    identity = dict(
        tokenizer=config.tokenizer,
        source=description,
        source_sha256=corpus_sha256(files),
        val_fraction=config.val_fraction,
    )
    if any(is_json_lines(path) for path in files):  # which field was read is part of what the data is
        identity["text_field"] = config.text_field
    meta_path = os.path.join(data_dir, "meta.json")
    shard_dir = os.path.join(data_dir, "shards.partial")  # finished shards of an unfinished prepare
    if os.path.exists(meta_path):
        old = load_meta(data_dir)
        if all(old.get(k) == v for k, v in identity.items()):
            print(f"{data_dir} already holds {description} tokenized with {config.tokenizer}", flush=True)
            return old
        if not overwrite:
            changed = [k for k, v in identity.items() if old.get(k) != v]
            raise UserError(
                f"{data_dir} already holds data prepared differently ({', '.join(changed)} differ). Choose another "
                f"--data_dir, or replace it: python -m machinery.corpus --overwrite --out_dir {data_dir} --source ..."
            )
    # token files without meta.json, and no prepare of ours cut short there (it keeps shard_dir until meta.json is
    # written): someone else's, such as nanoGPT's train.bin and val.bin, never replaced unasked
    held = [name for name in ("train.bin", "val.bin") if os.path.exists(os.path.join(data_dir, name))]
    if held and not os.path.exists(meta_path) and not os.path.isdir(shard_dir) and not overwrite:
        raise UserError(
            f"{data_dir} holds {' and '.join(held)} but no meta.json, so they are not token files of ours (nanoGPT "
            f"writes such files too); nothing there was touched. Choose another --data_dir, or replace them: "
            f"python -m machinery.corpus --overwrite --out_dir {data_dir} --source ..."
        )

    tokenizer = get_tokenizer(config.tokenizer)
    dtype = token_dtype(tokenizer.vocab_size)
    plan = dict(identity, chunk_chars=chunk_chars, shard_chars=shard_chars, dtype=np.dtype(dtype).name)
    if os.path.exists(shard_dir) and read_json(os.path.join(shard_dir, "plan.json")) != plan:
        shutil.rmtree(shard_dir)  # left by a prepare of other inputs: of no use here
    os.makedirs(shard_dir, exist_ok=True)
    write_json_atomic(os.path.join(shard_dir, "plan.json"), plan)
    tmp_train, tmp_val = (os.path.join(data_dir, f"{s}.bin.tmp") for s in ("train", "val"))
    try:
        counts = tokenize_shards(
            shards(files, chunk_chars, shard_chars),
            shard_dir,
            config.text_field,
            config.tokenizer,
            dtype,
            config.workers or os.cpu_count() or 1,
            description,
            total_chars=None if any(p.endswith(".gz") for p in files) else sum(os.path.getsize(p) for p in files),
        )
        n_tokens, n_documents = sum(c["tokens"] for c in counts), sum(c["documents"] for c in counts)
        if n_tokens == 0:
            raise UserError(f"--source {config.source!r} produced no tokens: the corpus is empty")
        with open(tmp_train, "wb") as out:  # the shards in order: the whole token stream
            for i in range(len(counts)):
                with open(shard_path(shard_dir, i), "rb") as f:
                    shutil.copyfileobj(f, out)
        # The held-out split is the tail of the stream (as nanoGPT splits
        # Shakespeare): copy the tail to val, then cut it off train.
        n_val = max(1, int(n_tokens * config.val_fraction))
        n_train = n_tokens - n_val
        itemsize = np.dtype(dtype).itemsize
        with open(tmp_train, "r+b") as src, open(tmp_val, "wb") as dst:
            src.seek(n_train * itemsize)
            shutil.copyfileobj(src, dst)
            src.truncate(n_train * itemsize)
        meta = dict(
            identity,
            vocab_size=tokenizer.vocab_size,
            eot_token=tokenizer.eot,
            dtype=np.dtype(dtype).name,
            train_tokens=n_train,
            val_tokens=n_val,
            documents=n_documents,
        )
        remove_if_exists(meta_path)  # data without meta.json is never taken for prepared
        os.replace(tmp_train, os.path.join(data_dir, "train.bin"))
        os.replace(tmp_val, os.path.join(data_dir, "val.bin"))
        write_json_atomic(meta_path, meta)
        shutil.rmtree(shard_dir)
    except UserError:  # bad input: nothing to resume from
        shutil.rmtree(shard_dir, ignore_errors=True)
        raise
    finally:
        remove_if_exists(tmp_train)
        remove_if_exists(tmp_val)
    print(f"prepared {data_dir}: {n_train:,} train + {n_val:,} val tokens ({meta['dtype']})", flush=True)
    return meta


def shards(files, chunk_chars, shard_chars):
    """The corpus as shards: lists of (piece, whether a document ends after it), about
    shard_chars characters each, in corpus order. Every document ends with end-of-text, except
    empty ones before the first text."""
    shard, size, seen_text = [], 0, False
    for path in files:
        for document in documents(path, chunk_chars):
            empty = True
            for piece, ends_document in marked_ends(document):
                shard.append((piece, ends_document))
                size += len(piece) if isinstance(piece, str) else len(piece[2])
                empty, seen_text = False, True
                if size >= shard_chars:
                    yield shard
                    shard, size = [], 0
            if empty and seen_text:  # an empty document after the first text still ends with end-of-text
                shard.append(("", True))
    if shard:
        yield shard


def marked_ends(document):
    """(piece, is it the document's last) for each non-empty piece, one piece ahead: a document
    read in pieces is never held whole."""
    previous = None
    for piece in document:
        if piece:
            if previous is not None:
                yield previous, False
            previous = piece
    if previous is not None:
        yield previous, True


def shard_path(shard_dir, i):
    return os.path.join(shard_dir, f"{i:06d}.bin")


def tokenize_shards(corpus_shards, shard_dir, text_field, tokenizer_name, dtype, workers, description, total_chars):
    """Tokenize each shard into shard_dir (workers processes, at most 2 shards per worker in
    flight); skip the shards a killed prepare had finished. Returns each shard's counts."""
    counts, pending, skipped, pool, held, t0 = [], [], 0, None, None, time.time()
    last_print = t0
    start_tokenizer(tokenizer_name)  # a corpus of one shard is tokenized here, starting no processes

    def collect(result):
        nonlocal last_print
        counts.append(result if isinstance(result, dict) else result.get())
        if time.time() - last_print > 2:
            last_print = time.time()
            print(progress_line(description, counts, time.time() - t0, total_chars), flush=True)

    try:
        for i, shard in enumerate(corpus_shards):
            done = read_json(shard_path(shard_dir, i) + ".json")  # written after the shard: it is complete
            if done is not None:
                skipped += 1
                counts.append(done)
                continue
            job = (shard, text_field, shard_path(shard_dir, i), dtype)
            if workers > 1 and pool is None:
                if held is None:  # the first shard waits: a corpus of one shard is not worth the workers
                    held = job
                    continue
                # forked where the platform can (no interpreter start-up, no re-import): they run no torch
                method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
                pool = multiprocessing.get_context(method).Pool(workers, start_tokenizer, (tokenizer_name,))
                pending.append(pool.apply_async(tokenize_shard, (held,)))
                held = None
            pending.append(pool.apply_async(tokenize_shard, (job,)) if pool else tokenize_shard(job))
            while len(pending) > (2 * workers if pool else 0):
                collect(pending.pop(0))
        if held is not None:
            pending.append(tokenize_shard(held))
        while pending:
            collect(pending.pop(0))
    finally:
        if pool:
            pool.terminate()
    if skipped:
        print(f"resumed: {skipped} of {len(counts)} shards were already tokenized, skipped", flush=True)
    print(progress_line(description, counts, time.time() - t0, total_chars), flush=True)
    return counts


_tokenizer = None  # each worker's own tokenizer


def start_tokenizer(name):
    global _tokenizer
    _tokenizer = get_tokenizer(name)


def tokenize_shard(job):
    """(shard, text_field, path, dtype) -> the shard's ids, end-of-text after each document,
    written to path (atomically, then its counts beside it); returns the counts."""
    shard, text_field, path, dtype = job
    ids, chars, documents_ended = [np.zeros(0, dtype=dtype)], 0, 0
    for piece, ends_document in shard:
        text = piece if isinstance(piece, str) else json_text(piece, text_field)
        ids.append(np.asarray(_tokenizer.encode(text) + ([_tokenizer.eot] if ends_document else []), dtype=dtype))
        chars, documents_ended = chars + len(text), documents_ended + ends_document
    ids = np.concatenate(ids)
    ids.tofile(path + ".tmp")
    os.replace(path + ".tmp", path)
    counts = dict(tokens=len(ids), chars=chars, documents=documents_ended)
    write_json_atomic(path + ".json", counts)
    return counts


def progress_line(description, counts, seconds, total_chars):
    chars, tokens = sum(c["chars"] for c in counts), sum(c["tokens"] for c in counts)
    eta = f", ETA {max(0.0, total_chars - chars) / max(chars / max(seconds, 1e-9), 1):.0f}s" if total_chars else ""
    return (
        f"tokenizing {description}: {len(counts)} shards, {sum(c['documents'] for c in counts):,} documents, "
        f"{chars / 1e6:.1f}M chars -> {tokens / 1e6:.2f}M tokens, {chars / 1e6 / max(seconds, 1e-9):.1f} MB/s"
        f"{eta} ({seconds:.0f}s)"
    )


def default_data_dir(dcfg):
    """data/<source>-<tokenizer>, the source reduced to a folder-safe name: 'texts/*.txt' -> texts_txt. A long one
    (an absolute path) keeps its last 40 characters and a hash of the whole, so two sources never share a folder."""

    def folder_safe(text):
        name = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_") or "corpus"
        return f"{name[-40:].strip('_')}_{hashlib.sha256(text.encode()).hexdigest()[:8]}" if len(name) > 48 else name

    return os.path.join("data", f"{folder_safe(dcfg.source)}-{folder_safe(dcfg.tokenizer)}")  # a tokenizer's path too


def load_or_prepare(dcfg, data_dir):
    """The meta of data_dir's token files, tokenizing the corpus there first if it has none."""
    if not os.path.exists(os.path.join(data_dir, "meta.json")):
        return prepare(dcfg, data_dir)
    meta = load_meta(data_dir)  # prepared earlier, here or by python -m machinery.corpus
    if meta["tokenizer"] != dcfg.tokenizer:
        raise UserError(
            f"{data_dir} holds data tokenized with {meta['tokenizer']!r}, not --tokenizer {dcfg.tokenizer!r}: "
            "pass the tokenizer it was prepared with, or another --data_dir"
        )
    return meta


def is_json_lines(path):
    return path.endswith((".jsonl", ".jsonl.gz"))


def documents(path, chunk_chars):
    """Yield the documents of one corpus file, each a list of pieces: a text file is one document
    (read in pieces of about chunk_chars, each a str); a JSON Lines file is one document per line,
    read a line at a time (so memory stays bounded) and left unparsed, as (path, line number, line):
    the workers parse it (json_text), in parallel."""
    if not is_json_lines(path):
        yield read_chunks(path, chunk_chars)
        return
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield [(path, number, line)]


def json_text(item, text_field):
    """The document text in one JSON line, (path, line number, line), under text_field."""
    path, number, line = item
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}, line {number}: not JSON ({e}); each line must be one JSON object") from None
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        fields = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise UserError(
            f"{path}, line {number}: no text under --text_field {text_field!r} "
            f"(its fields: {fields}); pass the field that holds the text"
        )
    return record[text_field]


def read_chunks(path, chunk_chars):
    """Yield a text file's content in pieces of about chunk_chars, cut after a newline."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            carry = ""
            while block := f.read(chunk_chars):
                block = carry + block
                cut = block.rfind("\n") + 1 or len(block)
                carry = block[cut:]
                yield block[:cut]
            if carry:
                yield carry
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text ({e}); remove it from the corpus") from None


# ----------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = DataConfig()
    parser.add_argument(
        "--source",
        default=defaults.source,
        help="stdlib | shakespeare | a text or JSON Lines (.jsonl, .jsonl.gz) file, folder or glob",
    )
    parser.add_argument(
        "--tokenizer", default=defaults.tokenizer, help="byte | a tiktoken encoding (gpt2, ...) | a tokenizer.json"
    )
    parser.add_argument("--out_dir", required=True, help="where train.bin, val.bin and meta.json go")
    parser.add_argument("--val_fraction", type=float, default=defaults.val_fraction)
    parser.add_argument("--url", default=defaults.url, help="mirror for a named download (file:// works)")
    parser.add_argument("--text_field", default=defaults.text_field, help="JSON Lines: the field holding the text")
    parser.add_argument("--workers", type=int, default=defaults.workers, help="tokenizing processes; 0 = every core")
    parser.add_argument("--overwrite", action="store_true", help="replace data prepared from other inputs")
    args = parser.parse_args(argv)
    config = DataConfig(args.source, args.tokenizer, args.val_fraction, args.url, args.text_field, args.workers)
    try:
        meta = prepare(config, args.out_dir, overwrite=args.overwrite)
    except UserError as e:
        sys.exit(f"error: {e}")
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
