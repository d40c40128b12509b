"""What a checkpoint holds (Checkpointer.snapshot) and how a resume restores it (Checkpointer.restore),
in-process on tiny runs: a resumed run takes bitwise the steps the saved run took, each piece is put back,
--resume_without leaves out only what it names, and two pipeline stages save the single-device form."""

import copy
import io
import random

import numpy as np
import pytest
import torch
from conftest import write_word_corpus

import train
from machinery.components import run_setup
from machinery.health.incidents import Recovery
from machinery.job.config import parse_args
from machinery.job.local_ranks import run_ranks
from parallel.grid import destroy_distributed

SAVED_AT, STEPS_AFTER = 4, 4  # steps before the checkpoint, and steps taken again after the resume
BATCH = 2  # rows a step reads
# dropout draws from torch's generator at every step; fp16 keeps a loss scaler (with a growth tracker) to save;
# eval_interval 2 and a window of 4 give the monitor val losses and baselines before the checkpoint
# fmt: off
TINY = [
    "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16", "--batch_size", str(BATCH),
    "--lanes", "4", "--dropout", "0.1", "--device", "cpu", "--dtype", "float16", "--max_iters", "20",
    "--warmup_iters", "4", "--learning_rate", "3e-3", "--eval_interval", "2", "--eval_iters", "1",
    "--monitor_window", "4",
]
# fmt: on
# what an earlier incident left: a lowered LR, re-warming from step 3 (the runbook's state to carry)
AFTER_AN_INCIDENT = Recovery(incidents=1, lr_scale=0.5, last_incident_step=3, rewarm_from=3, rewarm_iters=4)
PIECES = ("model", "optimizer", "scaler", "step", "data", "rng", "monitor", "recovery", "config", "meta")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Matrices this small gain nothing from threads, which wait for each other on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A little corpus and its token files, prepared once."""
    root = tmp_path_factory.mktemp("checkpoint_state")
    write_word_corpus(root / "corpus.txt", 400)
    return root


def new_run(corpus, *extra, out="out"):
    """A fresh tiny Run in corpus/out, as train.py's set_up builds it (which seeds torch's generator)."""
    argv = ["--source", corpus / "corpus.txt", "--data_dir", corpus / "data", "--out_dir", corpus / out, *TINY, *extra]
    preset, _, configs = parse_args([str(a) for a in argv])
    return train.set_up(preset, configs)


def step_lr(run, step):
    """The LR train()'s loop gives this step."""
    recovery = run.incidents.recovery
    return train.lr_at(recovery.schedule_step(step), run.job.configs.train) * recovery.lr_factor(step)


def take_steps(run, first, n):
    """What train()'s loop does in n steps from step `first` (no incident strikes here): [what it logs per step]."""
    records = []
    for step in range(first, first + n):
        record = {"step": step}
        if step % run.job.configs.train.eval_interval == 0:
            record.update(run.validate(step))
            run.incidents.monitor.check_eval(record["val_loss"])
        lr = step_lr(run, step)
        loss, grad_norm = train.optimizer_step(
            run.learner.model,
            run.learner.optimizer,
            run.learner.scaler,
            run.data.train_stream.next_batch,
            lr,
            run.job.configs.train,
        )
        grad_norm_z, fired = run.incidents.monitor.check_step(loss.item(), grad_norm.item())
        record.update(
            loss=loss.item(),
            lr=lr,
            grad_norm=grad_norm.item(),
            grad_norm_z=grad_norm_z,
            fired=[name for name, _ in fired],
        )
        records.append(record)
    return records


def written_and_read(state):
    """The state as a checkpoint file holds it: torch.save, then torch.load(weights_only=True), as checkpoint.py
    does. A state that keeps views of the live tensors is thereby frozen at the moment it was written."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        return torch.load(buffer, weights_only=True)
    except Exception as e:
        pytest.fail(
            "a checkpoint holds tensors and plain containers only (dicts, lists, numbers, strings), which "
            f"torch.load(weights_only=True) reads back; this one does not load: {type(e).__name__}: "
            f"{str(e).splitlines()[0][:300]}"
        )


def weights(run):
    return {name: p.detach().clone() for name, p, _ in run.learner.model.local_parameters()}


def moments(run):
    """{parameter name: {exp_avg, exp_avg_sq, step}} of AdamW, copied."""
    return {
        name: {key: value.clone() for key, value in run.learner.optimizer.state[p].items()}
        for name, p, _ in run.learner.model.local_parameters()
        if p in run.learner.optimizer.state
    }


def draw_from_every_generator():
    """The next number of each random generator a step may draw from."""
    return {"python random": random.random(), "numpy": float(np.random.random()), "torch": torch.rand(3).tolist()}


@pytest.fixture
def saved(corpus):
    """A run after SAVED_AT steps, its checkpoint (written and read back), what it held at that moment, and
    what it did next: the draws of every generator, then STEPS_AFTER more steps."""
    run = new_run(corpus)
    run.incidents.recovery.load_state_dict(AFTER_AN_INCIDENT.state_dict())
    take_steps(run, 0, SAVED_AT)
    # a step may draw from Python's and numpy's generators too (a data loader's shuffle, say): here they have, so
    # the saved states differ from a fresh run's, whose --seed seeds every generator alike
    random.random(), np.random.random()
    had = dict(
        weights=weights(run),
        moments=moments(run),
        position=run.data.train_stream.position,
        lr=step_lr(run, SAVED_AT),
        monitor=copy.deepcopy(run.incidents.monitor.state_dict()),
        recovery=copy.deepcopy(run.incidents.recovery),
        scaler=run.learner.scaler.state_dict(),
    )
    state = written_and_read(run.checkpointer.snapshot(SAVED_AT))
    had["draws"] = draw_from_every_generator()
    records = take_steps(run, SAVED_AT, STEPS_AFTER)
    return dict(run=run, state=state, had=had, records=records, final_weights=weights(run))


def resumed(corpus, saved, into="a fresh run", forget=()):
    """(run, the step Checkpointer.restore returned) after restoring the saved checkpoint."""
    run = saved["run"] if into == "the same run" else new_run(corpus)
    return run, run.checkpointer.restore(copy.deepcopy(saved["state"]), forget=forget)


def check_same_tensors(got, want, what):
    assert got.keys() == want.keys(), f"{what}: expected the entries {sorted(want)}, got {sorted(got)}"
    for name in want:
        g, w = got[name], want[name]
        if isinstance(w, dict):
            check_same_tensors(g, w, f"{what} of {name}")
            continue
        assert g.shape == w.shape, f"{what}: {name} has shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        assert torch.equal(g, w), (
            f"{what}: {name} differs from the saved run's by up to "
            f"{(g.double() - w.double()).abs().max().item():.3g} (expected equal)"
        )


# ----------------------------------------------------------------------------
# What the checkpoint holds


def test_a_checkpoint_holds_every_piece_under_its_name(saved):
    """The rest of the project reads these names (resume, --eval_only, the rollback, the notebooks)."""
    state, run = saved["state"], saved["run"]
    assert isinstance(state, dict), f"Checkpointer.snapshot returns a dict of pieces, got {type(state).__name__}"
    missing = [piece for piece in PIECES if piece not in state]
    assert not missing, f"a checkpoint holds {', '.join(PIECES)}: expected them all, missing {', '.join(missing)}"
    assert state["step"] == SAVED_AT, (
        f"the checkpoint's step is the step it was saved at (where the run "
        f"continues): expected {SAVED_AT}, got {state['step']}"
    )
    assert state["data"] == {"position": SAVED_AT * BATCH}, (
        f"the data position is the training stream's state_dict after {SAVED_AT} steps of {BATCH} rows: "
        f"expected {{'position': {SAVED_AT * BATCH}}}, got {state['data']}"
    )
    assert state["config"] == run.folder.identity, (
        f"the checkpoint's config is the run's identity (run.json), which "
        f"a resume checks the model's shape against: got {state['config']}"
    )
    assert state["meta"] == run.data.meta, (
        f"the checkpoint's meta is the token files' meta.json: expected {run.data.meta}, got {state['meta']}"
    )
    names = {name for name, _, _ in run.learner.model.local_parameters()}
    assert names <= set(state["model"]), (
        f"the weights are the single-device state dict: expected every "
        f"parameter's name, missing {sorted(names - set(state['model']))}"
    )
    check_same_tensors(
        {name: state["model"][name] for name in names},
        saved["had"]["weights"],
        "the checkpoint's weights are those at the moment it was saved",
    )


# ----------------------------------------------------------------------------
# Each piece, put back


def test_restore_returns_the_step_and_the_schedule_continues_there(corpus, saved):
    run, step = resumed(corpus, saved)
    assert step == SAVED_AT, (
        f"Checkpointer.restore returns the checkpoint's step, where the run continues: expected {SAVED_AT}, got {step}"
    )
    got, want = step_lr(run, SAVED_AT), saved["had"]["lr"]
    assert got == want, (
        f"the LR of step {SAVED_AT} after the resume is the saved run's (the schedule is not "
        f"restarted): expected {want}, got {got}"
    )


def test_restore_puts_back_the_weights(corpus, saved):
    run, _ = resumed(corpus, saved)
    check_same_tensors(weights(run), saved["had"]["weights"], "the weights after the resume")


def test_restore_puts_back_adamws_moments(corpus, saved):
    run, _ = resumed(corpus, saved)
    check_same_tensors(
        moments(run), saved["had"]["moments"], "AdamW's state (exp_avg, exp_avg_sq, step) after the resume"
    )


def test_restore_puts_back_the_data_position(corpus, saved):
    run, _ = resumed(corpus, saved)
    want = saved["had"]["position"]
    assert run.data.train_stream.position == want, (
        f"the training stream's position after the resume (rows read so "
        f"far): expected {want}, got {run.data.train_stream.position}"
    )


def test_restore_puts_back_every_random_generator(corpus, saved):
    resumed(corpus, saved)
    got, want = draw_from_every_generator(), saved["had"]["draws"]
    for generator in want:
        assert got[generator] == want[generator], (
            f"after the resume, {generator} draws what the saved run drew "
            f"next: expected {want[generator]}, got {got[generator]}"
        )


def test_restore_puts_back_the_monitors_baselines(corpus, saved):
    run, _ = resumed(corpus, saved)
    got, want = run.incidents.monitor.state_dict(), saved["had"]["monitor"]
    for key in want:
        assert got[key] == want[key], (
            f"the health monitor's {key} after the resume (its baselines decide what "
            f"a spike is): expected {want[key]}, got {got[key]}"
        )


def test_restore_puts_back_the_runbooks_state(corpus, saved):
    run, _ = resumed(corpus, saved)
    want, got = saved["had"]["recovery"], run.incidents.recovery
    assert isinstance(got, Recovery), f"the run's recovery is a Recovery after the resume, got {type(got).__name__}"
    assert got == want, (
        f"the runbook's state after the resume (incidents, LR scale, re-warm): expected {want}, got {got}"
    )


def test_restore_puts_back_the_loss_scaler(corpus, saved):
    run, _ = resumed(corpus, saved)
    got, want = run.learner.scaler.state_dict(), saved["had"]["scaler"]
    for key in want:  # the scale, and the steps since it last grew (_growth_tracker)
        assert got.get(key) == want[key], (
            f"the fp16 loss scaler's {key} after the resume: expected {want[key]}, got {got.get(key)}"
        )


def test_a_checkpoint_saved_without_loss_scaling_resumes_under_fp16(corpus, saved):
    """--dtype auto picks bf16 where the device has it, else fp16 on a GPU: a run saved without loss scaling (its
    scaler's state empty) may go on under fp16, and its scaler then starts afresh, at its initial scale."""
    run = new_run(corpus)  # --dtype float16: the scaler is on
    fresh = run.learner.scaler.state_dict()
    state = dict(copy.deepcopy(saved["state"]), scaler={})  # what a bf16 or fp32 run's disabled scaler saves
    try:
        step = run.checkpointer.restore(state)
    except Exception as e:
        pytest.fail(
            f"a checkpoint whose scaler state is empty (saved without fp16 loss scaling) resumes under "
            f"fp16: expected no error, got {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        )
    assert step == SAVED_AT, (
        f"a checkpoint saved without loss scaling, resumed under fp16: the step is the "
        f"checkpoint's: expected {SAVED_AT}, got {step}"
    )
    assert run.learner.scaler.state_dict() == fresh, (
        f"a checkpoint saved without loss scaling leaves the fp16 scaler as "
        f"it starts: expected {fresh}, got {run.learner.scaler.state_dict()}"
    )


# ----------------------------------------------------------------------------
# --resume_without


@pytest.mark.parametrize("piece", ["optimizer", "data_position", "schedule"])
def test_resume_without_a_piece_leaves_out_that_piece_only(corpus, saved, piece):
    run, step = resumed(corpus, saved, forget=(piece,))
    had = saved["had"]
    position = 0 if piece == "data_position" else had["position"]
    assert run.data.train_stream.position == position, (
        f"--resume_without {piece}: the data position (rows read) "
        f"after the resume: expected {position}, got "
        f"{run.data.train_stream.position}"
    )
    schedule_from = step if piece == "schedule" else had["recovery"].schedule_from
    assert run.incidents.recovery.schedule_from == schedule_from, (
        f"--resume_without {piece}: the step the LR schedule "
        f"counts from: expected {schedule_from}, got "
        f"{run.incidents.recovery.schedule_from}"
    )
    recovery = dict(vars(had["recovery"]), schedule_from=schedule_from)
    assert vars(run.incidents.recovery) == recovery, (
        f"--resume_without {piece}: the rest of the runbook's state is the "
        f"checkpoint's: expected {recovery}, got {vars(run.incidents.recovery)}"
    )
    if piece == "optimizer":
        assert not moments(run), (
            f"--resume_without optimizer: AdamW starts from zero moments (no state), got "
            f"state for {sorted(moments(run))}"
        )
    else:
        check_same_tensors(moments(run), had["moments"], f"--resume_without {piece}: AdamW's state")
    check_same_tensors(weights(run), had["weights"], f"--resume_without {piece}: the weights")


def test_resuming_again_without_the_schedule_restarts_it_at_the_new_resume(corpus, saved):
    """A run resumed without its schedule at step s counts its LR schedule from s; checkpointed at s + 2, it
    resumes counting from s again, or, once more without the schedule, from s + 2: the restart is the resume's
    own step, not added to the checkpoint's earlier restart."""
    run, first = resumed(corpus, saved, forget=("schedule",))
    take_steps(run, first, 2)
    state = written_and_read(run.checkpointer.snapshot(first + 2))
    for forget, want in (((), first), (("schedule",), first + 2)):
        again = new_run(corpus)
        again.checkpointer.restore(copy.deepcopy(state), forget=forget)
        how = "without the schedule" if forget else "in full"
        got = again.incidents.recovery.schedule_from
        assert got == want, (
            f"a run resumed without its schedule at step {first}, checkpointed at step {first + 2} and resumed "
            f"{how}: the step its LR schedule counts from: expected {want}, got {got}"
        )


def test_a_checkpoint_without_optimizer_state_resumes_under_reset_optimizer(corpus, saved):
    """An older checkpoint may hold no optimizer state: --reset_optimizer accepts it, with fresh moments."""
    run = new_run(corpus, "--reset_optimizer")
    state = {piece: value for piece, value in copy.deepcopy(saved["state"]).items() if piece != "optimizer"}
    step = run.checkpointer.restore(state)
    assert step == SAVED_AT, (
        f"a checkpoint without optimizer state, under --reset_optimizer: the step is the "
        f"checkpoint's: expected {SAVED_AT}, got {step}"
    )
    assert not moments(run), (
        f"a checkpoint without optimizer state: AdamW starts from zero moments (no state), "
        f"got state for {sorted(moments(run))}"
    )
    check_same_tensors(weights(run), saved["had"]["weights"], "a checkpoint without optimizer state: the weights")
    assert run.data.train_stream.position == saved["had"]["position"], (
        f"a checkpoint without optimizer state: the data position: expected {saved['had']['position']}, got "
        f"{run.data.train_stream.position}"
    )


# ----------------------------------------------------------------------------
# A resume takes the same steps


@pytest.mark.parametrize("into", ["a fresh run", "the same run"])
def test_a_resumed_run_takes_bitwise_the_steps_the_saved_run_took(corpus, saved, into):
    """Restore, then take the same steps again: every logged number equal, not close. "the same run" is the
    rollback after an incident: it restores into a run that has gone on since the checkpoint."""
    run, step = resumed(corpus, saved, into)
    draw_from_every_generator()  # as the saved run did right after the checkpoint
    records = take_steps(run, step, STEPS_AFTER)
    for want, got in zip(saved["records"], records):
        for key in want:
            assert got.get(key) == want[key], (
                f"step {want['step']} after restoring into {into}: the {key} is the "
                f"saved run's, bitwise: expected {want[key]}, got {got.get(key)}"
            )
    check_same_tensors(
        weights(run), saved["final_weights"], f"the weights {STEPS_AFTER} steps after restoring into {into}"
    )


# ----------------------------------------------------------------------------
# The single-device form, on two pipeline stages
#
# Each stage holds one of the two blocks (the first also the embeddings, the last the final norm and its own copy
# of the tied wte as the head), named as the stage names them ("blocks.0" on both): a state dict of this rank's
# module, or of its optimizer, is a part of the model's under other names and indices.

TWO_STAGES = ["--n_layer", "2", "--pp", "2", "--schedule", "gpipe", "--dtype", "float32"]


def _save_and_restore_on_rank(corpus):
    """On each of 2 pipeline stages: 2 steps, the checkpoint (written and read), a third step, the restore.
    Returns the shapes the checkpoint holds, and how far this stage's parameters and moments are from those it
    had at the save."""
    run = new_run(corpus, *TWO_STAGES, out="out_pp2")
    try:
        take_steps(run, 0, 2)
        had_weights, had_moments = weights(run), moments(run)
        state = written_and_read(run.checkpointer.snapshot(2))
        take_steps(run, 2, 1)
        try:
            run.checkpointer.restore(state)
            restored = None
        except Exception as e:  # reported by the test of the restore; the shapes saved are still worth a look
            restored = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"

        def far(got, want):  # None where equal; else what differs
            if tuple(got.shape) != tuple(want.shape):
                return f"shape {tuple(got.shape)} instead of {tuple(want.shape)}"
            return None if torch.equal(got, want) else f"differs by up to {(got - want).abs().max().item():.3g}"

        optimizer_state = state["optimizer"]["state"]
        now = moments(run)
        return dict(
            restored=restored,
            model={name: list(t.shape) for name, t in state["model"].items()},
            moments={int(i): {key: list(v.shape) for key, v in m.items()} for i, m in optimizer_state.items()},
            weights_after={name: far(p, had_weights[name]) for name, p in weights(run).items()},
            moments_after={
                f"{name} {key}": far(now.get(name, {}).get(key, torch.empty(0)), value)
                for name, m in had_moments.items()
                for key, value in m.items()
            },
        )
    finally:
        destroy_distributed()


@pytest.fixture(scope="module")
def two_stages(corpus):
    new_run(corpus)  # the token files, prepared before the ranks start
    outcome = run_ranks(2, _save_and_restore_on_rank, corpus, timeout=120)
    problems = {rank: value for rank, (status, value) in outcome.items() if status != "ok"}
    assert not problems, f"every rank saves and restores: expected none to fail, got {problems}"
    return outcome


def test_two_pipeline_stages_save_the_single_device_form(corpus, two_stages):
    whole = new_run(corpus, "--n_layer", "2", out="out_whole").learner.model.module  # the single-device GPT, same shape
    want = {name: list(t.shape) for name, t in whole.state_dict().items()}
    order = [name for group in run_setup.parameter_groups(whole.named_parameters()) for name, _ in group]
    for rank, (_, got) in two_stages.items():
        for name in want:
            assert got["model"].get(name) == want[name], (
                f"stage {rank} of 2: the checkpoint holds every stage's "
                f"{name}, as one device has it: expected shape "
                f"{want[name]}, got {got['model'].get(name)}"
            )
        for i, name in enumerate(order):
            shapes = got["moments"].get(i, {})
            for key in ("exp_avg", "exp_avg_sq"):
                expected = want[name]
                assert shapes.get(key) == expected, (
                    f"stage {rank} of 2: AdamW's state {i} is {name}'s, as one "
                    f"device numbers them: expected {key} of shape {expected}, "
                    f"got {shapes.get(key)}"
                )


def test_two_pipeline_stages_restore_their_parts(two_stages):
    for rank, (_, got) in two_stages.items():
        assert got["restored"] is None, (
            f"stage {rank} of 2: restoring the checkpoint takes this stage's part of "
            f"the single-device state: expected no error, got {got['restored']}"
        )
        for what in ("weights_after", "moments_after"):
            wrong = {name: problem for name, problem in got[what].items() if problem is not None}
            assert not wrong, (
                f"stage {rank} of 2: after the restore, its {what.split('_')[0]} are its part of "
                f"the checkpoint's, as at the save: expected equal, got {wrong}"
            )
