"""The model a run starts from: a fresh init, the same on every rank, or --init_from's weights, read and fitted to
the run (transfer.py reads them) at set-up, and loaded into the rank's model by the start of a run (Run.start)."""

import os
from dataclasses import asdict, replace
from typing import NamedTuple

from data import read_json
from errors import UserError
from machinery.components import checkpoint
from machinery.components.run_folder import config_changes, data_changes
from machinery.interchange.transfer import fit_to_run, initial_weights
from machinery.job.arms import ArmedGPT
from machinery.job.cluster import say
from model import padded_vocab_size


class InitialWeights(NamedTuple):
    state_dict: dict  # single-device form, this run's names and shapes
    source: str  # where they came from, in words
    data: dict | None  # what the source read, if it is a run of ours (its run.json's "data"); None: unknown


def initial_model(configs, meta, grid, device, out_dir):
    """(configs with the model's vocabulary, the whole single-device GPT every rank starts from, --init_from's
    weights for start() to load, or None). A fresh init is the same on every rank, so any layout starts alike.
    --init_from gives the weights only: the optimizer, the step, the data and the LR schedule are this run's. A run
    that already holds checkpoints of its own resumes from them, so its source is not read again: only its
    vocabulary (the source's rows, recorded in run.json) shapes the model."""
    configs = replace(configs, model=replace(configs.model, vocab_size=padded_vocab_size(meta["vocab_size"])))
    if not configs.train.init_from:
        return configs, ArmedGPT(configs.model).to(device), None
    # rank 0 decides, and every rank follows: a rank that read the source alone would wait for the others forever
    recorded_vocab_size = grid.on_rank0(lambda: vocab_size_of_a_run_to_resume(out_dir, configs.train))
    if recorded_vocab_size is not None:
        configs = replace(configs, model=replace(configs.model, vocab_size=recorded_vocab_size))
        return configs, ArmedGPT(configs.model).to(device), None
    gpt_config, weights = read_initial_weights(configs, meta, grid)
    configs = replace(configs, model=gpt_config)
    return configs, ArmedGPT(configs.model).to(device), weights


def vocab_size_of_a_run_to_resume(out_dir, cfg):
    """The vocab_size run.json records when out_dir holds checkpoints of a run from this --init_from, which it will
    resume (or refuse, when the rest of its identity differs); None when it starts afresh."""
    path = os.path.join(out_dir, "run.json")
    if cfg.overwrite or not os.path.isfile(path) or not checkpoint.list_steps(os.path.join(out_dir, "ckpt")):
        return None
    recorded = read_json(path)
    if recorded.get("TrainConfig", {}).get("init_from") != cfg.init_from:
        return None
    return recorded.get("GPTConfig", {}).get("vocab_size")  # None: a malformed record, which prepare_out_dir names


def read_initial_weights(configs, meta, grid):
    """(the GPTConfig of the run's model, InitialWeights): --init_from's weights checked against and fitted
    to this run (transfer.fit_to_run), on every rank: rank 0 first, as it may download them (once)."""
    weights = None

    def read():
        nonlocal weights
        weights = initial_weights(configs.train.init_from, configs.train.init_url)

    grid.on_rank0(read)  # its failure stops every rank; then the others read what rank 0 fetched
    if grid.rank != 0:
        read()
    if weights.tokenizer is not None and weights.tokenizer != meta["tokenizer"]:
        raise UserError(
            f"--init_from {weights.description} learned {weights.tokenizer!r} tokens, and this run's data holds "
            f"{meta['tokenizer']!r} tokens: the same id would mean another token. Pass --tokenizer "
            f"{weights.tokenizer} (and its data)"
        )
    gpt_config, state_dict = fit_to_run(weights.gpt_config, weights.state_dict, configs.model, weights.description)
    return gpt_config, InitialWeights(state_dict, weights.description, weights.data)


def load_initial_weights(model, weights, job, meta, identity):
    """--init_from's weights (an InitialWeights, or None) into `model` (the model as this rank holds it), as a
    checkpoint's are (any layout). None: a run that had checkpoints of its own but none that verifies reads its
    source now, which set-up skipped. job: the run's Job; meta and identity: its data's and its run.json's."""
    configs, grid = job.configs, job.grid
    if weights is None:  # set-up built the model from run.json's record: the source must still fit it
        gpt_config, weights = read_initial_weights(configs, meta, grid)
        if changed := config_changes({"GPTConfig": asdict(configs.model)}, {"GPTConfig": asdict(gpt_config)}):
            raise UserError(
                f"--init_from {weights.source} no longer fits the model this run recorded ({'; '.join(changed)}): "
                "start over with --overwrite, or point --init_from at the weights the run started from"
            )
    checkpoint.load_full_state_dict(model, weights.state_dict)
    say(f"starting from the weights of {weights.source}: a fresh optimizer, step 0, this run's data")
    if weights.data is not None and (changed := data_changes(weights.data, identity["data"])):
        say(f"the data, against what {weights.source} read: {'; '.join(changed)}")
