"""A run's data: the token files (prepared once, by rank 0), the streams each rank reads its share of every batch
from, a mix's weights by step, and the val loss on the same rows every time."""

import os
from dataclasses import dataclass

from data import TokenStream
from errors import UserError
from machinery.components.evaluation import evaluate
from machinery.corpora.corpus import DataConfig, default_data_dir, load_or_prepare
from machinery.corpora.mixture import Mix, MixedStream, mix_meta, prepare_sources, read_mix, weights_at
from machinery.job.cluster import say


@dataclass
class RunData:
    """What the run reads: meta (the token files' meta.json; for a mix, the sources' together), the mix or None,
    the train stream (its position is the checkpoint's "data"), a val stream per source, and the micro-batches an
    evaluation reads on each rank."""

    meta: dict
    mix: Mix | None
    train_stream: TokenStream | MixedStream
    val_streams: dict[str, TokenStream]  # by source name; one source: one stream
    eval_batches: int  # micro-batches per evaluation of each val stream, on each rank
    tokens_per_step: int  # all ranks together

    def state_dict(self):
        return self.train_stream.state_dict()

    def load_state_dict(self, state):
        self.train_stream.load_state_dict(state)

    def validate(self, model, step):
        """{"val_loss": ...} of `model` (the model as this rank holds it): the mean loss on the first val rows. A mix
        adds "val_loss_by_source", and "mix_tokens" (each source's tokens read so far); its val_loss weighs the
        sources by the weights in force at `step`, the mix the train loss is drawn from, so the two stay comparable
        (the val-rise detector sets one against the other) when the mix changes."""
        losses = {name: evaluate(model, stream, self.eval_batches) for name, stream in self.val_streams.items()}
        if self.mix is None:
            (val_loss,) = losses.values()
            return {"val_loss": val_loss}
        return {
            "val_loss": sum(weights_at(self.mix, step)[name] * loss for name, loss in losses.items()),
            "val_loss_by_source": losses,
            "mix_tokens": self.train_stream.mix_tokens(),
        }

    def check_epochs(self, cfg):
        """Stop before training when the plan (cfg: the TrainConfig) reads its data more than --max_epochs times: a
        large preset pointed at a small corpus would mostly memorize it, and say nothing. For a mix, each source's
        share of the planned tokens (its weight, step by step) against that source's train tokens."""
        if not cfg.max_epochs:
            return
        if self.mix is None:
            planned = {"data": (cfg.max_iters * self.tokens_per_step, self.meta)}
        else:
            share = {name: 0.0 for name in self.mix.sources}  # steps' worth of each source over the plan
            for step in range(cfg.max_iters):
                for name, weight in weights_at(self.mix, step).items():
                    share[name] += weight
            planned = {
                name: (steps * self.tokens_per_step, self.meta["sources"][name]) for name, steps in share.items()
            }
        for name, (tokens, meta) in planned.items():
            epochs = tokens / meta["train_tokens"]
            if epochs > cfg.max_epochs:
                whose = (
                    f"; source {name!r} of the mix ({meta['source']}) gets {tokens:,.0f} of them" if self.mix else ""
                )
                raise UserError(
                    f"this run plans {cfg.max_iters:,} steps x {self.tokens_per_step:,} tokens = "
                    f"{cfg.max_iters * self.tokens_per_step:,} tokens{whose}, but its data holds "
                    f"{meta['train_tokens']:,} train tokens: it would read them {epochs:.1f} times, more than "
                    f"--max_epochs {cfg.max_epochs:g}. Past a few epochs a model mostly memorizes its data. Give it "
                    "more data (--source, --data_dir, --mix), plan fewer tokens (--max_iters), or pass --max_epochs 0 "
                    "to go on anyway"
                )


def check_a_corpus_is_named(preset, configs):
    """Refuse, before the run writes anything, to train on data nobody named: a --data_dir without token files that
    only the embedded default (stdlib) would fill, or a preset that names no corpus (gpt2-small) with none prepared."""
    cfg, dcfg = configs.train, configs.data
    default_dir = default_data_dir(dcfg)
    data_dir = cfg.data_dir or default_dir
    if cfg.mix or dcfg.source not in ("", DataConfig.source) or os.path.exists(os.path.join(data_dir, "meta.json")):
        return
    prepare = f"python -m machinery.corpus --source 'texts/**/*.txt' --tokenizer {dcfg.tokenizer} --out_dir"
    if cfg.data_dir and os.path.abspath(data_dir) != os.path.abspath(default_dir):
        named = f"the embedded default, {dcfg.source}, fills only its own folder ({default_dir})" if dcfg.source else ""
        raise UserError(
            f"--data_dir {cfg.data_dir} holds no token files (no meta.json), and the run names no corpus to prepare "
            f"there{': ' + named if named else ''}. Prepare yours once: {prepare} {cfg.data_dir} (or pass --source)"
        )
    if not dcfg.source:
        raise UserError(
            f"--preset {preset} names no corpus: its plan of {cfg.max_iters:,} steps needs data you choose, not a "
            f"default that would silently stand in for it. Prepare yours once, e.g. {prepare} data/texts, then pass "
            "--data_dir data/texts (or --source, or --mix)"
        )


def prepare_data(preset, configs, grid):
    """(the mix or None, meta, {source name: its data folder}): the token files, tokenized by rank 0 on first use.
    A mix prepares each of its sources into a folder of its own, data/<source>-<tokenizer> (under --data_dir if
    given), so a source shared by several mixes is tokenized once."""
    cfg, dcfg = configs.train, configs.data
    if cfg.mix:
        mix = read_mix(cfg.mix)
        prepared = grid.on_rank0(lambda: prepare_sources(mix, dcfg, cfg.data_dir or "data"))
        data_dirs = {name: data_dir for name, (data_dir, _) in prepared.items()}
        return mix, mix_meta(mix, {name: meta for name, (_, meta) in prepared.items()}), data_dirs
    data_dir = cfg.data_dir or default_data_dir(dcfg)
    meta = grid.on_rank0(lambda: load_or_prepare(dcfg, data_dir))
    return None, meta, {"data": data_dir}


def open_token_streams(mix, data_dirs, meta, cfg, block_size, grid):
    """(train stream, {source: val stream}, micro-batches per evaluation on each rank), announced. Each DP
    rank reads its share of every batch; --data_order shuffles the training data only, so every run is
    judged on the same val rows. A mix reads its sources' train files through one MixedStream."""

    def stream(data_dir, split, order_seed=0):
        return TokenStream(
            os.path.join(data_dir, f"{split}.bin"),
            meta["dtype"],
            cfg.batch_size,
            block_size,
            grid.dp_rank,
            grid.dp,
            cfg.lanes,
            order_seed,
        )

    for name, data_dir in data_dirs.items():
        source_meta = meta["sources"][name] if mix else meta
        say(
            f"data {data_dir}: {source_meta['source']}, {meta['tokenizer']} tokens, "
            f"{source_meta['train_tokens']:,} train + {source_meta['val_tokens']:,} val"
            + (f"; starting weight {mix.weights[name]:.3g}" if mix else "")
        )
    train_streams = {name: stream(data_dir, "train", cfg.data_order) for name, data_dir in data_dirs.items()}
    val_streams = {name: stream(data_dir, "val") for name, data_dir in data_dirs.items()}
    if mix:
        train_stream = MixedStream(
            mix, train_streams, cfg.batch_size, grid.dp_rank, grid.dp, cfg.gradient_accumulation_steps
        )
    else:
        (train_stream,) = train_streams.values()
    # an eval reads eval_iters global batches (fewer if a val.bin is smaller), in this rank's micro-batches
    global_batch = grid.dp * cfg.batch_size * cfg.gradient_accumulation_steps
    smallest = min(s.windows_per_epoch for s in val_streams.values())
    eval_iters = max(1, min(cfg.eval_iters, smallest // global_batch))
    return train_stream, val_streams, eval_iters * cfg.gradient_accumulation_steps
