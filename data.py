"""The token files a run reads, and TokenStream: sequential, resumable, rank-sharded batches from them.

Training never tokenizes on the fly. A corpus is tokenized once (corpora/corpus.py, `python -m machinery.corpus`,
or train.py on first use) into a folder of three files:

    train.bin, val.bin   every token id of the corpus, flat, in order (uint16, or uint32 past 65,536 ids: token_dtype)
    meta.json            the source and tokenizer, vocab_size, eot_token, the dtype, train_tokens and val_tokens

and a run reads them through a memory map, walking the file in order (TokenStream).
"""

import json
import os
import sys

import numpy as np
import torch

from errors import UserError

# ----------------------------------------------------------------------------
# The token files


def token_dtype(vocab_size):
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def read_json(path):
    """The JSON in path, or None if there is no such file; a file that holds no JSON is refused, named."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise UserError(f"{path} is not a JSON file ({e}): restore it, or remove the folder that holds it") from None


def load_meta(data_dir):
    path = os.path.join(data_dir, "meta.json")
    meta = read_json(path)
    if meta is None:
        raise UserError(f"{path} not found: prepare the data first (python -m machinery.corpus --out_dir {data_dir})")
    return meta


# ----------------------------------------------------------------------------
# TokenStream: the file, cut into windows, walked in order


class TokenStream:
    """Sequential batches (x, y), each int64 (B, T), from a token file.

    The file is cut into W windows of T+1 tokens that overlap by one (window i holds tokens [i*T, i*T + T]), so
    every token is predicted exactly once per epoch. To keep the rows of one batch from being neighbouring text, the
    windows are dealt into `lanes` contiguous lanes, read round-robin: read number r takes window (r mod lanes) *
    (W // lanes) + r // lanes. With lanes=1 it is a plain front-to-back walk; each epoch reads lanes * (W // lanes)
    windows, each once, and the last W mod lanes windows sit out.

    order_seed > 0 reads the same windows in another order: window w becomes window perm[w] of a random permutation
    seeded by order_seed, the same in every epoch. Two runs that differ only in it see the same data, each window
    once per epoch, in different sequences.

    The only state is `position`: how many rows the whole data-parallel group has read. Rank `rank` of `world_size`
    takes rows position + rank*B ... position + rank*B + B - 1, then position moves on by world_size * B; so the
    same position serves any world size with the same global batch.
    """

    def __init__(self, path, dtype, batch_size, block_size, rank=0, world_size=1, lanes=1, order_seed=0):
        try:
            self.tokens = np.memmap(path, dtype=dtype, mode="r")
        except ValueError as e:  # empty, or not a whole number of ids
            raise UserError(f"{path} holds no {np.dtype(dtype).name} token ids ({e}): prepare the data again") from None
        self.batch_size, self.block_size = batch_size, block_size
        self.rank, self.world_size = rank, world_size
        n_windows = (len(self.tokens) - 1) // block_size
        if n_windows < 1:
            raise UserError(
                f"{path} holds {len(self.tokens)} tokens, fewer than one block of "
                f"block_size + 1 = {block_size + 1}: lower --block_size or use a larger corpus"
            )
        self.lanes = min(lanes, n_windows)
        self.lane_length = n_windows // self.lanes
        self.windows_per_epoch = self.lanes * self.lane_length
        self.permutation = None  # (n_windows,) or None: the file's own order
        if order_seed:
            index_dtype = np.uint32 if n_windows < 2**32 else np.int64
            self.permutation = np.random.default_rng(order_seed).permutation(n_windows).astype(index_dtype)
        self.position = 0

    def window(self, row):
        r = row % self.windows_per_epoch
        w = (r % self.lanes) * self.lane_length + r // self.lanes
        return w if self.permutation is None else int(self.permutation[w])

    def next_batch(self):
        # exercise next_batch: begin
        B, T = self.batch_size, self.block_size
        first = self.position + self.rank * B
        starts = [self.window(first + b) * T for b in range(B)]
        rows = np.stack([self.tokens[s : s + T + 1] for s in starts]).astype(np.int64)  # (B, T+1)
        self.position += self.world_size * B
        x, y = rows[:, :-1], rows[:, 1:]  # y is x shifted by one: the next token
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
        # exercise next_batch: end

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = int(state["position"])


if __name__ == "__main__":
    # Older handouts say `python data.py --source ...`: preparing a corpus is the machinery's job now, and a
    # silent exit 0 here would let the next command train on another corpus.
    sys.exit(
        "error: data.py prepares no corpus: python -m machinery.corpus --source FILES --tokenizer byte --out_dir "
        "DIR does (python -m machinery.corpus --help lists its flags), then python train.py --data_dir DIR"
    )
