"""Checkpoints: in single-device form, written atomically, verified before use, loaded without running code,
thinned with age.

Single-device form: whatever the layout (tensor-parallel slices, pipeline
stages, ZeRO's and FSDP2's shards), a checkpoint holds the state dicts a
one-process run would hold. The parts are gathered whole and the stages merged
on the way out, and cut again on the way in, so a run saved on one layout
resumes on any other.

On disk, a checkpoint is a folder out_dir/ckpt/step_0001000/ holding state.pt and
manifest.json. state.pt holds only tensors and plain containers (so
`torch.load(weights_only=True)` reads it and a crafted pickle is refused, not
run); manifest.json holds the step, a healthy mark and each file's sha256.
Writing goes to step_0001000.tmp/, each file fsynced, then one rename: a crash
leaves the previous checkpoints and at most a .tmp folder that nothing reads.

"Latest" is the newest checkpoint whose files match their manifest; a
truncated or corrupted one is skipped with a warning. A command that reads a
run may name a step instead (load_chosen, --ckpt_step), whose checkpoint must
verify.

What a checkpoint holds is checkpointer.py's decision (`Checkpointer.snapshot`); this file
provides the means, the random generators' states as tensors among them.
"""

import json
import os
import random
import re
import shutil
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist

from errors import UserError
from machinery.job.cluster import say
from machinery.job.files import file_sha256, fsync_dir, write_synced
from model import GPT

STATE_FILE, MANIFEST_FILE = "state.pt", "manifest.json"
STEP_DIR = re.compile(r"^step_(\d{7})$")


# ----------------------------------------------------------------------------
# Single-device form: from the model as the ranks hold it, and back
#
# `model` is the model as this rank holds it (layout.RankModel); its local_parameters()
# name each parameter as the single-device model does and give its cut: None for a whole
# parameter, else a ParameterCut, whatever cut it (tensor parallelism's tensor_parallel.Cut,
# FSDP2's torch_engines.DTensorCut). The optimizer gives and takes its moments per parameter
# the same way whatever the layout (optimizer.AdamW's moments() and load_moments(); ZeRO's
# gather and cut their shards behind them). Every rank must call these functions: they gather
# over the TP and PP groups (under ZeRO and FSDP2, the DP group).


class ParameterCut(Protocol):
    """How a parameter is cut across ranks: the two calls checkpoint.py needs of any cut (tests/test_layout.py
    checks both implementers)."""

    def shard(self, full, grid):
        """This rank's part of a single-device tensor every rank holds, without communication."""

    def unshard(self, local, grid):
        """The single-device tensor, gathered from every rank's part (a collective: every rank calls it)."""


def gather_whole(tensor, cut, grid):
    """The single-device tensor of which `tensor` is this rank's part (cut None: it is whole)."""
    return tensor.detach() if cut is None else cut.unshard(tensor, grid)


def take_slice(full, cut, grid):
    """This rank's part of a single-device tensor: the inverse of gather_whole."""
    return full if cut is None else cut.shard(full, grid)


def _on_cpu(value):
    if isinstance(value, dict):
        return {key: _on_cpu(v) for key, v in value.items()}
    return value.cpu() if torch.is_tensor(value) else value


def merge_stages(mine, grid):
    """{name: value} of every pipeline stage, from this stage's part (moved to the CPU to travel as objects)."""
    if grid.pp == 1:
        return mine
    pieces = [None] * grid.pp
    dist.all_gather_object(pieces, _on_cpu(mine), group=grid.pp_group)
    return {name: value for piece in pieces for name, value in piece.items()}


def full_state_dict(model):
    """The single-device GPT's state dict of the model as this rank holds it (a RankModel): every slice gathered
    whole, every stage's part merged."""
    grid = model.grid
    full = merge_stages({name: gather_whole(p, cut, grid) for name, p, cut in model.local_parameters()}, grid)
    # a tied matrix under both names (an untied head, --tie_embeddings false, is a parameter of its own)
    full.update({alias: full[name] for alias, name in GPT.TIED.items() if alias not in full})
    return full


def load_full_state_dict(model, full):
    """Each rank takes its part of a single-device state dict: its stage's parameters, cut to its slices."""
    with torch.no_grad():
        for name, p, cut in model.local_parameters():
            p.copy_(take_slice(full[name], cut, model.grid))


def full_optimizer_state_dict(optimizer, model, groups):
    """AdamW's state dict as a single-device run saves it: moments gathered and merged like the
    weights, indexed in single-device order. groups: the single-device parameter names of
    each optimizer parameter group, in order (run_setup.make_optimizer's groups)."""
    held, grid = optimizer.moments(), model.grid
    mine = {
        name: {key: gather_whole(value, cut, grid) if value.dim() > 0 else value for key, value in held[p].items()}
        for name, p, cut in model.local_parameters()
        if p in held
    }
    moments = merge_stages(mine, grid)
    order = [name for names in groups for name in names]  # AdamW numbers parameters across its groups, in order
    param_groups, first = [], 0
    for group, names in zip(optimizer.state_dict()["param_groups"], groups):
        param_groups.append(dict(group, params=list(range(first, first + len(names)))))
        first += len(names)
    return {
        "state": {i: moments[name] for i, name in enumerate(order) if name in moments},
        "param_groups": param_groups,
    }


def load_full_optimizer_state_dict(optimizer, full, model, groups):
    """Each rank takes the moments of its own parameters from a single-device AdamW state dict, cut to its slices."""
    order = [name for names in groups for name in names]
    mine = {name: (p, cut) for name, p, cut in model.local_parameters()}
    moments = {}
    for i, state in full["state"].items():
        if order[i] in mine:
            p, cut = mine[order[i]]
            moments[p] = {
                key: take_slice(value, cut, model.grid) if value.dim() > 0 else value for key, value in state.items()
            }
    optimizer.load_moments(moments, full["param_groups"])


# ----------------------------------------------------------------------------
# On disk


def step_path(ckpt_dir, step):
    return os.path.join(ckpt_dir, f"step_{step:07d}")


def save(ckpt_dir, step, state, healthy):
    """Write state as the checkpoint of `step`; return its folder. An OSError (full or
    read-only disk) becomes a UserError that says the earlier checkpoints are untouched."""

    def fill(tmp):
        state_path = os.path.join(tmp, STATE_FILE)
        write_synced(state_path, lambda f: torch.save(state, f), "wb")
        manifest = {"step": step, "healthy": healthy, "files": {STATE_FILE: file_sha256(state_path)}}
        write_synced(os.path.join(tmp, MANIFEST_FILE), lambda f: json.dump(manifest, f, indent=1))

    try:
        return write_folder(ckpt_dir, step, fill)
    except OSError as e:
        raise UserError(
            f"could not write the checkpoint of step {step} to {ckpt_dir} ({e}). The earlier checkpoints "
            "there are untouched: free some space (or make the folder writable) and run again to resume."
        ) from None


def mirror(ckpt_dir, mirror_dir, step):
    """Copy the checkpoint of `step` into mirror_dir (--ckpt_mirror, a second disk or file system) as save writes
    one, each file synced, and the copy checked against the manifest before its rename."""

    def fill(tmp):
        for name in (STATE_FILE, MANIFEST_FILE):
            with open(os.path.join(step_path(ckpt_dir, step), name), "rb") as source:
                write_synced(os.path.join(tmp, name), lambda f: shutil.copyfileobj(source, f, 1 << 24), "wb")
        problem = verify(tmp)
        if problem is not None:
            raise OSError(f"the copy does not verify: {problem}")

    try:
        return write_folder(mirror_dir, step, fill)
    except OSError as e:
        raise UserError(
            f"could not mirror the checkpoint of step {step} to {mirror_dir} ({e}). The one in {ckpt_dir} and the "
            "earlier mirrored ones are untouched: free some space there (or make it writable) and run again to resume."
        ) from None


def write_folder(ckpt_dir, step, fill):
    """The checkpoint folder of `step`: fill(tmp) writes its files into step_N.tmp/, then one rename puts it in
    place, made durable by syncing ckpt_dir. The same step saved again (after a rollback) sets the old folder aside
    first: a folder is not renamed over a non-empty one. An OSError leaves no .tmp folder behind."""
    final = step_path(ckpt_dir, step)
    tmp, old = final + ".tmp", final + ".old"
    try:
        os.makedirs(ckpt_dir, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        fill(tmp)
        if os.path.exists(final):
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        fsync_dir(ckpt_dir)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_manifest(path):
    with open(os.path.join(path, MANIFEST_FILE)) as f:
        return json.load(f)


def is_healthy(path):
    try:
        return bool(read_manifest(path)["healthy"])
    except (OSError, ValueError, KeyError):
        return False


def verify(path):
    """None if every file of the checkpoint matches its manifest, else what is wrong."""
    try:
        manifest = read_manifest(path)
        for name, digest in manifest["files"].items():
            if file_sha256(os.path.join(path, name)) != digest:
                return f"{name} does not match its sha256 (truncated or corrupted)"
    except (OSError, ValueError, KeyError) as e:
        return f"unreadable manifest or file ({e})"
    return None


def list_steps(ckpt_dir):
    """Steps that have a checkpoint folder, newest first (verified or not)."""
    if not os.path.isdir(ckpt_dir):
        return []
    steps = [int(m.group(1)) for name in os.listdir(ckpt_dir) if (m := STEP_DIR.match(name))]
    return sorted(steps, reverse=True)


def load(path, device="cpu"):
    """The state dict of a checkpoint folder. weights_only=True: plain tensors and
    containers only; anything else (a pickled object, code) raises instead of running."""
    return torch.load(os.path.join(path, STATE_FILE), map_location=device, weights_only=True)


def load_verified(path, device="cpu"):
    """(state, None) of a checkpoint folder that verifies and holds plain tensors only, else (None, what is wrong)."""
    problem = verify(path) if os.path.isdir(path) else "there is no such checkpoint"
    if problem is not None:
        return None, problem
    try:
        return load(path, device), None
    except Exception as e:  # weights_only refuses anything but tensors and plain containers
        return None, f"refused to load: not a plain tensor checkpoint ({type(e).__name__}: {str(e)[:200]})"


def load_latest(ckpt_dir, device="cpu", healthy_only=False):
    """(step, state) of the newest checkpoint that verifies and loads, or None.

    A checkpoint that fails its manifest, or holds more than plain tensors, is
    said (cluster.say) and skipped in favour of the one before it.
    """
    found = find_latest([ckpt_dir], device, healthy_only)
    return None if found is None else (found[0], found[2])


def find_latest(ckpt_dirs, device="cpu", healthy_only=False):
    """(step, path, state) of the newest checkpoint in any of ckpt_dirs (a run's, then its --ckpt_mirror) that
    verifies and loads, or None. Of a step's copies, the first folder's that verifies: a corrupt or lost copy in
    one folder falls back to the other's before it falls back to an older step."""
    for step in sorted({s for folder in ckpt_dirs for s in list_steps(folder)}, reverse=True):
        copies = [step_path(folder, step) for folder in ckpt_dirs if os.path.isdir(step_path(folder, step))]
        for i, path in enumerate(copies):
            if healthy_only and not is_healthy(path) and verify(path) is None:
                continue
            state, problem = load_verified(path, device)
            if problem is None:
                return step, path, state
            fallback = "its copy in " + os.path.dirname(copies[i + 1]) if i + 1 < len(copies) else "the one before it"
            say(f"warning: skipping checkpoint {path}: {problem}; falling back to {fallback}")
    return None


def load_chosen(ckpt_dir, step=-1, device="cpu", healthy_only=False):
    """(step, state) of the checkpoint a command that reads a run asks for (--ckpt_step): -1, the newest that
    verifies (load_latest: None where none does); else the checkpoint of that step, which must verify and load,
    or a UserError that says why it does not and names the steps whose checkpoints do."""
    if step == -1:
        return load_latest(ckpt_dir, device, healthy_only)
    state, problem = load_verified(step_path(ckpt_dir, step), device)
    if problem is None:
        return step, state
    verified = [s for s in list_steps(ckpt_dir) if s != step and verify(step_path(ckpt_dir, s)) is None]
    choices = (
        f"The checkpoints there that verify: {', '.join(f'step {s}' for s in verified)}; name one with --ckpt_step N"
        if verified
        else "No other checkpoint there verifies"
    )
    raise UserError(f"the checkpoint of step {step} in {ckpt_dir} cannot be read: {problem}. {choices}")


def retain(ckpt_dir, keep_last, keep_every):
    """Delete checkpoints outside the policy, dense recent and sparse old: keep the newest
    keep_last, every step that is a multiple of keep_every, and always the newest one
    marked healthy (the one a rollback would restore). Returns the steps kept."""
    steps = list_steps(ckpt_dir)
    keep = set(steps[:keep_last]) | {s for s in steps if keep_every and s % keep_every == 0}
    keep |= set(next(([s] for s in steps if is_healthy(step_path(ckpt_dir, s))), []))
    for step in steps:
        if step not in keep:
            shutil.rmtree(step_path(ckpt_dir, step))
    return sorted(keep & set(steps))


def discard_after(ckpt_dir, step):
    """Remove checkpoints newer than `step`: after a rollback they belong to the abandoned timeline."""
    dropped = [s for s in list_steps(ckpt_dir) if s > step]
    for s in dropped:
        shutil.rmtree(step_path(ckpt_dir, s))
    return dropped


# ----------------------------------------------------------------------------
# Random generators, as tensors


def rng_state():
    """Every random generator a step may draw from. numpy's key becomes a tensor: a checkpoint
    holds tensors and plain containers only."""
    numpy_state = np.random.get_state(legacy=False)
    numpy_key = torch.from_numpy(numpy_state["state"]["key"].astype(np.int64))
    return {
        "python": random.getstate(),
        "numpy": {**numpy_state, "state": {**numpy_state["state"], "key": numpy_key}},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state):
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    numpy_key = numpy_state["state"]["key"].numpy().astype(np.uint32)
    np.random.set_state({**numpy_state, "state": {**numpy_state["state"], "key": numpy_key}})
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
