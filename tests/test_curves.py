"""The curve reader (curves.py): bands over seeds, the edge rule and its calibration, the shapes, the verdict line.

The default run reads synthetic curves, seeded; `-m integration` trains planted runs of a test-sized recipe (a band
of 8 seeds, 5 healthy new seeds, an LR x10, shuffled data, an injected spike, another data order), reads each,
compares checkpoints, and runs bench/bands.py and the command line end to end."""

import json
import math
import os
import shutil

import numpy as np
import pytest
from conftest import ROOT, run_script

from machinery.analysis import bands, compare, curves
from machinery.job.files import write_json_atomic

STEPS = 200
SETTINGS = dict(
    learning_rate=2e-3, min_lr=2e-4, warmup_iters=20, lr_decay_iters=0, max_iters=STEPS, grad_clip=1.0, weight_decay=0.1
)


def synthetic_run(seed, offset=None, jump_at=None, plateau_from=None, **settings):
    """A run's files as read: a falling train curve with a seed's own level and each step's batch noise (seeded),
    val every 20 steps. offset=(step, size): the curve moved by size from that step; jump_at: one point at ln V;
    plateau_from: the curve stops falling there."""
    rng = np.random.default_rng(seed)
    steps = np.arange(STEPS)
    clean = 2.5 + 3.0 * np.exp(-np.minimum(steps, plateau_from or STEPS) / 30) - 0.001 * steps
    if plateau_from:
        clean[plateau_from:] = clean[plateau_from]
    train = clean + rng.normal(0, 0.02) + rng.normal(0, 0.05, STEPS)
    if offset:
        train[offset[0] :] += offset[1]
    if jump_at:
        train[jump_at] = math.log(256)
    lr = {**SETTINGS, **settings}
    identity = {
        "GPTConfig": {"vocab_size": 256, "n_layer": 2, "block_size": 64},
        "data": {"source": "a corpus", "source_sha256": "ab12", "tokenizer": "byte", "val_fraction": 0.1},
        "TrainConfig": {**lr, "seed": seed, "data_order": seed, "global_batch": 8, "eval_iters": 10, "lanes": 64,
                        "init_from": "", "dtype": "float32"},
    }  # fmt: skip
    run = bands.LoggedRun(f"runs/seed_{seed}", identity, {"preset": "tiny", "recovery": {}})
    for t in steps:
        run.train[int(t)], run.lr[int(t)] = float(train[t]), lr["learning_rate"]
        run.grad_norm[int(t)], run.grad_z[int(t)] = 1.0, 0.0
        if t % 20 == 0:
            run.val[int(t)] = float(train[t] - rng.normal(0, 0.05) + 0.05)
    return run


@pytest.fixture(scope="module")
def band():
    return bands.make_band([synthetic_run(s) for s in range(1, 11)], "tiny", {"command": "a test"})


def test_the_band_holds_the_seeds_statistics_and_how_it_was_made(band):
    assert band["seeds"] == list(range(1, 11)) and band["data_orders"] == band["seeds"]
    assert band["made_by"] == {"command": "a test"} and band["settings"] == SETTINGS
    train = band["train"]
    assert train["step"] == list(range(STEPS)) and len(train["runs"]) == 10
    values = np.array(train["runs"])
    assert np.allclose(train["mean"], values.mean(0), atol=1e-5)
    assert np.allclose(train["std"], values.std(0, ddof=1), atol=1e-5)
    assert all(lo <= mid <= hi for lo, mid, hi in zip(train["q05"], train["q50"], train["q95"]))
    assert band["val"]["step"] == list(range(0, STEPS, 20))
    rule = band["rule"]
    assert rule["z"] in bands.Z_CHOICES and rule["persist"] == bands.PERSIST
    assert "each of the 10 seeds against the band of the other 9" in rule["calibration"]


def test_a_band_needs_enough_seeds_of_one_recipe():
    with pytest.raises(ValueError, match="at least 8 seeds"):
        bands.make_band([synthetic_run(s) for s in range(1, 5)], "tiny", {})
    other = synthetic_run(9)
    other.identity["GPTConfig"]["n_layer"] = 4
    with pytest.raises(ValueError, match="runs/seed_9 is another recipe .*model n_layer 4 \\(the band's 2\\)"):
        bands.make_band([synthetic_run(s) for s in range(1, 9)] + [other], "tiny", {})


def test_healthy_new_seeds_read_normal(band):
    readings = [curves.read_curve(synthetic_run(s), band) for s in range(101, 106)]
    assert sum(not r.normal for r in readings) <= 1, [r.verdict for r in readings]
    assert all(r.verdict.startswith("verdict: normal (p = ") for r in readings if r.normal)


def test_a_run_that_moves_away_is_flagged_at_the_step_it_left(band):
    reading = curves.read_curve(synthetic_run(101, offset=(120, 0.5)), band)
    assert reading.verdict.startswith("verdict: not normal: left the band at step 120 for 80 steps, above it")
    assert reading.left == (120, 199, "above")
    lower = curves.read_curve(synthetic_run(102, offset=(60, -0.4)), band)
    assert lower.left[0] == 60 and lower.left[2] == "below"


def test_one_batch_of_garbage_is_a_jump(band):
    reading = curves.read_curve(synthetic_run(101, jump_at=90), band)
    assert reading.left is None
    assert "a jump at step 90 to 5.545" in reading.verdict and reading.verdict.startswith("verdict: not normal")


def causes_of(reading):
    """{cause: (its rank from 1, the evidence's strength in words)} of the reader's ranked causes."""
    first = next(i for i, line in enumerate(reading.lines) if line.startswith("what the chapter names as causes"))
    ranked = [line.split(". ", 1)[1] for line in reading.lines[first + 1 : first + 1 + len(curves.CAUSES)]]
    return {line.split(" (")[0]: (n, line.split(" (")[1].split("):")[0]) for n, line in enumerate(ranked, 1)}


def skipped_at(run, step, restored, detector="nonfinite", response="skip"):
    """run with the runbook's record of one incident at `step`: rolled back to `restored`, one batch skipped."""
    action = {"restored_step": restored, "skipped_rows": [8 * step, 8 * step + 8]}
    run.incidents.append({"step": step, "detector": detector, "response": response, "action": action})
    return run


def test_the_settings_a_user_changed_are_named_with_the_band(band):
    reading = curves.read_curve(synthetic_run(101, offset=(0, 0.3), learning_rate=2e-2), band)
    assert "settings that differ from the band's: learning_rate 0.02 (the band's 0.002)" in reading.lines
    causes = causes_of(reading)
    assert causes["an LR too high where the loss is high"] == (1, "pointed at")  # above the band: a cause
    assert [causes[c][0] for c in curves.CAUSES[::2]] == [2, 3]  # the rest in the chapter's order
    assert "10x the band's 0.002" in next(line for line in reading.lines if line.startswith("1. an LR too high"))
    # below the band is out of it too: the schedule moved the curve; a setting that is not the LR's is no LR
    ahead = causes_of(curves.read_curve(synthetic_run(101, offset=(0, -0.3), learning_rate=2e-2), band))
    assert ahead["an LR too high where the loss is high"] == (1, "pointed at")
    clipped = curves.read_curve(synthetic_run(101, offset=(0, 0.3), grad_clip=0.5), band)
    assert "settings that differ from the band's: grad_clip 0.5 (the band's 1.0)" in clipped.lines
    assert causes_of(clipped)["an LR too high where the loss is high"][1] == "no sign of it"


def test_a_setting_that_differs_is_a_cause_where_the_run_left_the_band(band):
    no_warmup = curves.read_curve(synthetic_run(101, offset=(40, 0.4), warmup_iters=0), band)
    assert causes_of(no_warmup)["an LR too high where the loss is high"] == (1, "pointed at")
    said = next(line for line in no_warmup.lines if line.startswith("1. an LR too high"))
    assert "warmup_iters 0 (the band's 20)" in said and "so these settings are a cause" in said
    # flagged for one point only, inside the band: the setting is named, the batch ranks first
    jumped = curves.read_curve(synthetic_run(101, jump_at=90, warmup_iters=0), band)
    assert causes_of(jumped)["bad data"] == (1, "consistent with it")
    assert causes_of(jumped)["an LR too high where the loss is high"][1] == "no sign of it"


def test_planted_faults_and_the_runbooks_cure_rank_the_causes(band):
    nan = skipped_at(synthetic_run(101), 100, 100)
    nan.injected = ["nan@100"]
    assert causes_of(curves.read_curve(nan, band))["a hardware bit flip"] == (1, "planted")
    spike = skipped_at(synthetic_run(101), 100, 100, detector="spike")
    spike.injected = ["spike@100"]
    assert causes_of(curves.read_curve(spike, band))["bad data"] == (1, "planted")
    # nothing planted: a skip that ended a loss spike points at the batch; a non-finite loss that a rollback ended
    # may be a batch or a flipped bit (the rollback restores the weights too), equal evidence, the chapter's order
    assert causes_of(curves.read_curve(skipped_at(synthetic_run(101), 100, 100, "spike"), band))["bad data"] == (
        1,
        "pointed at",
    )
    causes = causes_of(curves.read_curve(skipped_at(synthetic_run(101), 100, 100), band))
    assert causes["bad data"] == (1, "consistent with it") and causes["a hardware bit flip"] == (
        2,
        "consistent with it",
    )
    lowered = skipped_at(skipped_at(synthetic_run(101), 60, 60, "spike"), 80, 60, "spike", response="lower_lr")
    assert causes_of(curves.read_curve(lowered, band))["an LR too high where the loss is high"] == (1, "pointed at")


def test_no_single_point_is_judged_after_a_runbook_skip(band):
    """After the skip the run reads each batch a step earlier than the band's seeds would: a point at a logged step
    is another batch than the band logged there, so only stretches are judged from the restored step on."""
    after = curves.read_curve(skipped_at(synthetic_run(101, jump_at=150), 120, 110), band)
    assert after.jumps == [] and "a jump" not in after.verdict
    shift = "the run reads each batch earlier than a run without its incidents (1 step from step 110)"
    assert shift in "\n".join(after.lines)
    before = curves.read_curve(skipped_at(synthetic_run(101, jump_at=90), 120, 110), band)
    assert [t for t, _ in before.jumps] == [90]
    moved = curves.read_curve(skipped_at(synthetic_run(101, offset=(150, 0.5)), 120, 110), band)
    assert moved.left[0] == 150  # a stretch out of the band still is one
    twice = curves.read_curve(skipped_at(skipped_at(synthetic_run(101), 60, 50), 150, 140), band)
    assert "(1 step from step 50, then 2 steps from step 140)" in "\n".join(twice.lines)  # each skip adds one


def test_the_verdict_leads_with_the_longest_stretch_and_ends_with_the_p_value(band):
    run = synthetic_run(101)
    for t in run.train:  # a short stretch below early (a faster warmup, say), a long one above late
        run.train[t] += -0.6 if 10 <= t < 16 else 0.5 if t >= 100 else 0.0
    run.val = {t: v + 0.5 * (t >= 100) for t, v in run.val.items()}
    reading = curves.read_curve(run, band)
    assert reading.verdict.startswith(
        "verdict: not normal: left the band at step 100 for 100 steps, above it, the longest of 2 stretches out of it "
        "(the first at step 10, below it, for 6 steps)"
    ), reading.verdict
    step, value, p = bands.val_p(run, band)
    assert f"for 6 steps); val loss {value:.4f} at step {step}, p = {p:.2g}; " in reading.verdict
    healthy = curves.read_curve(synthetic_run(102), band)
    assert healthy.normal and healthy.verdict == f"verdict: normal (p = {bands.val_p(synthetic_run(102), band)[2]:.2f})"


def test_the_precision_line_says_which_dtype_the_run_computed_in():
    run = synthetic_run(101)
    run.settings["dtype"] = "auto"
    for computed_in, said in [
        ([[0, "bfloat16"]], "--dtype auto, which this run resolved to bfloat16: bfloat16 autocast"),
        ([[0, "bfloat16"], [120, "float32"]], "resolved to bfloat16 from step 0, float32 from step 120"),
        ([[0, "float16"]], "resolved to float16: loss scaling, 0 step(s) skipped"),
        ([[700, "bfloat16"]], "resolved to bfloat16 from step 700:"),  # a run.json from before the record began
        ([], "--dtype auto; this run's files do not say what it resolved to"),
    ]:
        run.computed_in = computed_in
        assert said in curves.precision_evidence(run)[1]


def test_the_figure_holds_the_whole_verdict_and_marks_every_jump(band):
    run = synthetic_run(101, jump_at=150)
    reading = curves.read_curve(run, band)
    ax = curves.reading_figure(run, band, reading).axes[0]
    assert ax.get_title(loc="left").replace("\n", " ") == reading.verdict
    low, high = ax.get_ylim()  # the second half's range: the start near ln V and the jump lie above it
    assert high < run.ln_vocab and low < min(v for t, v in run.train.items() if t >= 100)
    (marker,) = [line for line in ax.get_lines() if line.get_label() == "jump"]
    assert list(marker.get_xdata()) == [150] and list(marker.get_ydata()) == [high]  # at the edge, its value beside
    assert any(text.get_text().startswith(f"{math.log(256):.2f}") for text in ax.texts)
    early = synthetic_run(101)  # read at step 80 of the band's 200: the axis spans its own second half
    early.train = {t: v for t, v in early.train.items() if t <= 80}
    early.val = {t: v for t, v in early.val.items() if t <= 80}
    low, high = curves.reading_figure(early, band, curves.read_curve(early, band)).axes[0].get_ylim()
    assert low < min(early.train.values()) and high > max(v for t, v in early.train.items() if t >= 40)


def run_folder_with_checkpoints(folder, steps):
    """A run folder as compare reads it before evaluating: run.json, one logged step, ckpt/ with those steps."""
    run = synthetic_run(1)
    os.makedirs(folder / "ckpt")
    write_json_atomic(str(folder / "run.json"), {**run.identity, "config": {"preset": "tiny"}})
    record = {"step": 0, "loss": 5.5, "lr": 1e-3, "grad_norm": 1.0, "grad_norm_z": 0.0}
    (folder / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    for step in steps:
        os.makedirs(folder / "ckpt" / f"step_{step:07d}")
    return str(folder)


def test_compare_refuses_runs_that_share_no_step_of_the_longer_ones_last_third(tmp_path):
    short = run_folder_with_checkpoints(tmp_path / "short", [0, 400, 500, 600])
    long = run_folder_with_checkpoints(tmp_path / "long", [0, 1800, 1900, 2000])
    with pytest.raises(SystemExit, match=r"share only step 0, before any training.*short holds steps 0, 400, 500, 600"):
        compare.main([short, long])
    longer = run_folder_with_checkpoints(tmp_path / "longer", [0, 200, 400, 600, 1900, 2000])
    with pytest.raises(
        ValueError,
        match=r"share checkpoint steps up to 600 only, before the last third of .*longer's 2000 steps.*"
        r"longer holds steps 0, 200, 400, 600, 1900, 2000",
    ):
        compare.compare_runs([short, longer])


def test_compare_takes_the_shared_steps_from_the_longer_runs_last_third_on():
    assert compare.steps_to_compare({"a": [0, 1400], "b": [0, 1400, 2000]}) == [0, 1400]  # 1400 >= 2/3 of 2000
    assert compare.steps_to_compare({"a": [2000], "b": [1000, 2000, 3000]}) == [2000]  # at 2/3 of 3000 exactly
    with pytest.raises(ValueError, match="up to 1300 only, before the last third of b's 2000 steps"):
        compare.steps_to_compare({"a": [0, 1300], "b": [0, 1300, 2000]})


def test_a_plateau_above_the_band_points_at_the_data_or_the_lr(band):
    run = synthetic_run(101, plateau_from=30)
    assert curves.phase(run)[0] == "early plateau"
    reading = curves.read_curve(run, band)
    assert "a plateau above the band: the data or the LR" in reading.verdict


def test_the_shapes_of_a_curve():
    assert curves.phase(synthetic_run(1))[0] == "long tail"
    assert curves.phase(synthetic_run(1, plateau_from=40))[0] == "early plateau"
    short = synthetic_run(1)
    short.train = dict(list(short.train.items())[:5])
    assert curves.phase(short)[0] == "start"
    early = synthetic_run(1)
    early.train = dict(list(early.train.items())[:40])
    assert curves.phase(early)[0] == "fast fall"
    assert "near ln V = 5.545: a uniform guess" in curves.first_loss_words(synthetic_run(1))
    rising = synthetic_run(1, offset=(150, 1.0))
    assert curves.phase(rising)[0] == "rising"
    flat = synthetic_run(1)
    flat.train = {t: 3.0 for t in flat.train}  # no noise at all: flat, not a division by zero
    assert curves.phase(flat)[0] == "early plateau"


def test_the_p_value_is_students_t():
    assert bands.student_t_p(0.0, 9) == 1.0
    assert bands.student_t_p(2.262, 9) == pytest.approx(0.05, abs=5e-4)  # the table's 97.5% point, 9 dof
    assert bands.student_t_p(-3.250, 9) == pytest.approx(0.01, abs=2e-4)
    assert bands.student_t_p(1.96, 10_000) == pytest.approx(0.05, abs=5e-4)  # the normal's, for many dof


def test_without_a_band_the_reader_says_why(tmp_path, band):
    run = synthetic_run(101)
    assert bands.find_band(run.identity, "tiny", str(tmp_path / "none.json"))[1].startswith("no band file")
    other = dict(band, recipe={**band["recipe"], "data": {**band["recipe"]["data"], "source_sha256": "cd34"}})
    write_json_atomic(str(tmp_path / "other.json"), other)
    _, why = bands.find_band(run.identity, "tiny", str(tmp_path / "other.json"))
    assert "is another recipe: data source_sha256 'ab12' (the band's 'cd34')" in why
    write_json_atomic(str(tmp_path / "anchors.json"), {"preset": "gpt2-small", "anchors": []})
    assert "holds published anchors only" in bands.find_band(run.identity, "", str(tmp_path / "anchors.json"))[1]
    (tmp_path / "broken.json").write_text("{")
    assert "cannot be read" in bands.find_band(run.identity, "", str(tmp_path / "broken.json"))[1]
    reading = curves.read_curve(run, None, why)
    assert reading.verdict.startswith("verdict: no band for this run: ") and reading.normal is None


def test_the_committed_bands_name_their_seeds_and_their_making():
    band = bands.read_json(os.path.join(ROOT, "bands", "shakespeare.json"))
    assert len(band["seeds"]) >= bands.MIN_SEEDS and band["made_by"]["command"].startswith("python bench/bands.py")
    assert len(band["train"]["runs"]) == len(band["seeds"]) and band["recipe"]["data"]["source_sha256"]
    anchors = bands.read_json(os.path.join(ROOT, "bands", "gpt2-small.json"))["anchors"]
    assert anchors and all(a["source"].startswith("https://") for a in anchors)


def test_a_folder_that_is_not_a_run_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path}: no run.json"):
        bands.read_run(str(tmp_path))


# ----------------------------------------------------------------------------
# Planted runs of a test-sized recipe, trained

# fmt: off
SMALL = [
    "--n_layer", 2, "--n_embd", 32, "--n_head", 2, "--block_size", 64, "--batch_size", 8, "--max_iters", 150,
    "--warmup_iters", 30, "--log_interval", 1, "--eval_interval", 25, "--eval_iters", 10, "--ckpt_interval", 25,
    "--keep_every", 25, "--num_samples", 0, "--plot", "false", "--dtype", "float32",
]
# fmt: on


SHARES_THE_PLANTED_RUNS = pytest.mark.xdist_group("planted")  # under -n 2, on one worker: the runs are made once


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """{name: run folder} of the test recipe's runs, and the band of its 8 seeds (band.json)."""
    import contextlib
    import io

    import data
    import train

    root = tmp_path_factory.mktemp("planted")

    logs = {}

    def run(name, seed, *flags, order=None):
        argv = ["--out_dir", root / name, "--seed", seed, "--data_order", order or seed, *SMALL, *flags]
        with contextlib.redirect_stdout(io.StringIO()) as log:
            train.main([str(a) for a in argv])
        logs[name] = log.getvalue()
        return str(root / name)

    folders = {f"band_{s}": run(f"band_{s}", s) for s in range(1, 9)}
    band = bands.make_band([bands.read_run(folders[f"band_{s}"]) for s in range(1, 9)], "tiny", {"test": "planted"})
    write_json_atomic(str(root / "band.json"), band)
    (root / "bands").mkdir()
    write_json_atomic(str(root / "bands" / "tiny.json"), band)  # as bench/bands.py would write it for this recipe
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bands, "BANDS_DIR", str(root / "bands"))
        folders |= {f"healthy_{s}": run(f"healthy_{s}", s) for s in range(101, 106)}
    folders["lr10"] = run("lr10", 101, "--learning_rate", 2e-2, "--min_lr", 2e-3)
    folders["spike"] = run("spike", 101, "--inject", "spike@120")
    folders["nan"] = run("nan", 101, "--inject", "nan@110")
    folders["no_warmup"] = run("no_warmup", 101, "--warmup_iters", 0)
    folders["order"] = run("order", 101, order=202)
    shuffled = root / "shuffled_data"  # notebook 05's data plateau: train.bin's bytes shuffled, val.bin kept
    shuffled.mkdir()
    data_dir = os.path.join(ROOT, "data", "stdlib-byte")
    meta = data.load_meta(data_dir)
    tokens = np.fromfile(os.path.join(data_dir, "train.bin"), dtype=meta["dtype"])
    np.random.default_rng(0).permutation(tokens).tofile(shuffled / "train.bin")
    shutil.copyfile(os.path.join(data_dir, "val.bin"), shuffled / "val.bin")
    write_json_atomic(str(shuffled / "meta.json"), meta)  # the same corpus by its sha256: bad data, unlabelled
    folders["shuffled"] = run("shuffled", 101, "--data_dir", shuffled)
    return folders, band, str(root / "band.json"), logs


def reading_of(planted, name):
    folders, band, *_ = planted
    return curves.read_curve(bands.read_run(folders[name]), band)


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_planted_healthy_seeds_read_normal(planted):
    readings = [reading_of(planted, f"healthy_{s}") for s in range(101, 106)]
    assert sum(not r.normal for r in readings) <= 1, [r.verdict for r in readings]


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_a_run_ends_pointing_at_the_reader_where_a_band_applies(planted):
    folders, _, _, logs = planted
    last = logs["healthy_101"].splitlines()[-1]
    assert (
        last
        == f"is this curve normal? Against 8 seeds of its recipe: python -m machinery.curves {folders['healthy_101']}"
    )
    assert "curves.py" not in logs["band_1"]  # no band yet


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_planted_lr_x10_is_flagged_where_it_left_the_band(planted):
    reading = reading_of(planted, "lr10")
    assert reading.verdict.startswith(f"verdict: not normal: left the band at step {reading.left[0]} ")
    assert "learning_rate 0.02 (the band's 0.002)" in "\n".join(reading.lines)


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_planted_shuffled_data_is_a_plateau_of_the_data_or_the_lr(planted):
    reading = reading_of(planted, "shuffled")
    assert not reading.normal and "plateau above the band: the data or the LR" in reading.verdict


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_planted_spike_is_flagged_at_its_step_with_the_incident(planted):
    reading = reading_of(planted, "spike")
    assert not reading.normal and "incident: spike at step 120" in reading.verdict
    assert "faults planted by --inject (injected.json): spike@120" in reading.lines


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_a_planted_nan_weight_is_the_first_cause_and_no_point_after_the_skip_is_a_jump(planted):
    folders, *_ = planted
    run = bands.read_run(folders["nan"])
    reading = curves.read_curve(run, planted[1])
    assert causes_of(reading)["a hardware bit flip"] == (1, "planted")
    (action,) = [incident["action"] for incident in run.incidents]
    restored, (start, end) = action["restored_step"], action["skipped_rows"]
    assert all(t < restored for t, _ in reading.jumps)
    batches = (end - start) // 8  # the rows skipped, in global batches of 8: each read that many steps earlier
    assert f"reads each batch earlier than a run without its incidents ({batches} steps from step {restored})" in (
        "\n".join(reading.lines)
    )
    assert reading.verdict.startswith("verdict: not normal: incident: nonfinite at step 110")
    assert run.computed_in == [[0, "float32"]]  # run.json records the dtype the run computed in


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_a_planted_run_without_warmup_names_the_warmup_as_a_cause(planted):
    reading = reading_of(planted, "no_warmup")
    assert not reading.normal and reading.left is not None, reading.verdict
    assert causes_of(reading)["an LR too high where the loss is high"] == (1, "pointed at")
    said = next(line for line in reading.lines if line.startswith("1. an LR too high"))
    assert "warmup_iters 0 (the band's 30)" in said


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_planted_other_data_order_is_inside_the_band_and_compares_tied(planted):
    folders, _, band_path, _ = planted
    assert reading_of(planted, "order").normal
    results, verdict = compare.compare_runs([folders["healthy_101"], folders["order"]], band_path)
    assert verdict.startswith("verdict: tied within noise")
    own = bands.read_run(folders["order"]).val
    assert results[folders["order"]][150] == {"val_loss": own[150]}  # the fixed evaluation: the run's own


@SHARES_THE_PLANTED_RUNS
@pytest.mark.integration
def test_the_command_line_ends_with_the_verdict(planted):
    folders, _, band_path, _ = planted
    done = run_script(["-m", "machinery.curves", folders["shuffled"], "--band", band_path], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("verdict: not normal")
    assert os.path.exists(os.path.join(folders["shuffled"], "curves.png"))
    done = run_script(["-m", "machinery.compare", folders["healthy_101"], folders["order"], "--band", band_path], ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("verdict: tied within noise")
    assert os.path.exists(os.path.join(folders["healthy_101"], "compare.png"))


@pytest.mark.integration
def test_the_bands_bench_writes_a_band(tmp_path):
    out = tmp_path / "band.json"
    flags = ["--n_layer", "1", "--n_embd", "16", "--n_head", "1", "--block_size", "32", "--batch_size", "4",
             "--max_iters", "12", "--eval_interval", "6", "--eval_iters", "2", "--log_interval", "2",
             "--plot", "false"]  # fmt: skip
    command = ["bench/bands.py", "--preset", "tiny", "--seeds", "1-8", "--runs", tmp_path / "runs", "--out", out]
    done = run_script([*command, "--", *flags], ROOT)
    assert done.returncode == 0, done.stderr
    band = bands.read_json(str(out))
    assert band["seeds"] == list(range(1, 9)) and band["train"]["step"] == list(range(0, 12, 2)) + [11]
    again = run_script([*command, "--overwrite", "--", *flags], ROOT)  # the finished runs are read again
    assert again.returncode == 0 and again.stdout.count("finished earlier") == 8, again.stderr
    assert bands.read_json(str(out))["train"] == band["train"]
    other = run_script([*command, "--overwrite", "--", *flags, "--learning_rate", "1e-3"], ROOT)
    assert other.returncode != 0 and "seed_1 holds a finished run of another configuration" in other.stderr
    refused = run_script([*command, "--", *flags], ROOT)
    assert refused.returncode != 0 and "exists: pass --overwrite" in refused.stderr
