import copy
import math
import statistics

import pytest
import torch

from machinery.health.incidents import HealthMonitor
from machinery.health.monitor import SavedActivations, layer_grad_norms
from model import GPT, GPTConfig

SETTINGS = dict(window=10, spike_factor=2.0, grad_z_threshold=6.0, val_rise_evals=3)


def after_healthy_steps(losses, grad_norms, triggers=("nonfinite", "spike"), **overrides):
    """A monitor that has checked these steps, each of which must fire nothing."""
    monitor = HealthMonitor(**{**SETTINGS, **overrides}, triggers=list(triggers))
    for step, (loss, grad_norm) in enumerate(zip(losses, grad_norms)):
        _, fired = monitor.check_step(loss, grad_norm)
        assert fired == [], (
            f"a steady run fires nothing: step {step} (loss {loss}, grad norm {grad_norm}): expected [], got {fired}"
        )
    return monitor


STEADY_LOSSES = [1.0 + 0.01 * (i % 3) for i in range(10)]
STEADY_GRAD_NORMS = [1.0 + 0.05 * (i % 2) for i in range(10)]


def warmed(triggers=("nonfinite", "spike"), **overrides):
    """10 healthy steps: losses 1.00-1.02 (median 1.01), grad norms 1.00 / 1.05 (mean 1.025, std 0.025)."""
    return after_healthy_steps(STEADY_LOSSES, STEADY_GRAD_NORMS, triggers, **overrides)


def fired_names(fired):
    return [name for name, _ in fired]


# (window, healthy losses, healthy grad norms): baselines where the usual mistakes move the spike threshold
SPIKE_BASELINES = [
    pytest.param(10, STEADY_LOSSES, STEADY_GRAD_NORMS, id="steady"),
    # median 1.0, mean 1.36: a spike judged over the mean (threshold 2.72) would let 2.06 through
    pytest.param(10, [1.0] * 6 + [1.9] * 4, STEADY_GRAD_NORMS, id="median-below-mean"),
    # a full window of 4 whose median (1.1) moves to 1.2 if the loss being judged joins it
    pytest.param(4, [1.0, 1.0, 1.2, 1.2], [1.0, 1.1, 1.0, 1.1], id="short-window"),
    # 5 healthy losses in a window of 10: the first step baseline_ready() judges, before the window fills
    pytest.param(10, [1.0, 1.2, 1.0, 1.2, 1.1], [1.0, 1.1, 1.0, 1.1, 1.0], id="baseline-just-ready"),
]


@pytest.mark.parametrize("window, losses, grad_norms", SPIKE_BASELINES)
def test_spike_is_judged_against_the_recent_median(window, losses, grad_norms):
    """A loss above spike_factor x the median of the healthy losses before it is a spike; just below, it is not."""
    monitor = after_healthy_steps(losses, grad_norms, window=window)
    median = statistics.median(losses[-window:])
    for loss in (0.97 * SETTINGS["spike_factor"] * median, 1.03 * SETTINGS["spike_factor"] * median):
        judged = copy.deepcopy(monitor)
        _, fired = judged.check_step(loss, statistics.fmean(grad_norms))
        is_spike = loss > SETTINGS["spike_factor"] * median
        assert ("spike" in fired_names(fired)) == is_spike, (
            f"loss {loss:.4f} against {SETTINGS['spike_factor']} x the median {median:.4f} of the healthy losses "
            f"{losses[-window:]} is {'a spike' if is_spike else 'no spike'}: expected "
            f"{['spike'] if is_spike else []}, got {fired_names(fired)}"
        )
        if is_spike:
            values = dict(fired)["spike"]
            assert values["baseline"] == pytest.approx(median), (
                f"the spike reports its baseline, the median of the healthy losses before it: expected {median}, "
                f"got {values['baseline']}"
            )
            assert judged.is_incident(fired), f"spike is a trigger here: expected an incident, got {fired}"


# (spike_factor, healthy losses): every value a binary fraction, so the median and factor x median are exact floats
# and a loss can sit exactly on the bound, however a body writes the comparison
SPIKE_BOUNDS = [
    pytest.param(2.0, [1.0] * 5 + [1.5] * 5, id="factor-2-bound-2.5"),  # median 1.25
    pytest.param(1.5, [0.625, 0.875] * 5, id="factor-1.5-bound-1.125"),  # median 0.75
]


@pytest.mark.parametrize("spike_factor, losses", SPIKE_BOUNDS)
def test_a_loss_exactly_at_the_spike_bound_is_no_spike(spike_factor, losses):
    """A spike is a loss more than spike_factor x the median: the loss exactly at the bound is none, the next float
    above it is one, the float below it is none."""
    monitor = after_healthy_steps(losses, STEADY_GRAD_NORMS, spike_factor=spike_factor)
    median = statistics.median(losses)
    bound = spike_factor * median
    for loss, is_spike in [(math.nextafter(bound, 0), False), (bound, False), (math.nextafter(bound, math.inf), True)]:
        _, fired = copy.deepcopy(monitor).check_step(loss, statistics.fmean(STEADY_GRAD_NORMS))
        assert ("spike" in fired_names(fired)) == is_spike, (
            f"loss {loss!r} against the bound {spike_factor} x the median {median} = {bound!r} is "
            f"{'above it, a spike' if is_spike else 'not above it, no spike'}: expected "
            f"{['spike'] if is_spike else []}, got {fired_names(fired)}"
        )


def test_spikes_and_warnings_stay_out_of_the_baselines():
    """Only healthy steps feed the baselines: a run of spikes keeps firing, a run of high grad norms keeps
    warning, and a NaN step leaves the next normal step unjudged by it."""
    monitor = warmed()
    for repeat in range(6):
        _, fired = monitor.check_step(2.5, 1.0)
        assert fired_names(fired) == ["spike"], (
            f"spike number {repeat + 1} in a row (loss 2.5 over the healthy median 1.01): expected ['spike'], "
            f"got {fired_names(fired)}; a spike is no healthy step and stays out of the median"
        )
    monitor = warmed()
    for repeat in range(4):
        z, fired = monitor.check_step(1.0, 5.0)
        assert fired_names(fired) == ["grad_z"], (
            f"warning number {repeat + 1} in a row (grad norm 5.0, healthy mean 1.025, std 0.025, z = 159): "
            f"expected ['grad_z'], got {fired_names(fired)} with z = {z}"
        )
    monitor = warmed()
    monitor.check_step(float("nan"), float("nan"))
    z, fired = monitor.check_step(1.01, 1.025)
    assert fired == [] and z == pytest.approx(0, abs=1e-6), (
        f"a normal step after a NaN one is judged against the healthy steps only: expected z = 0 and nothing "
        f"fired, got z = {z} and {fired_names(fired)}"
    )


NON_FINITE = [
    (float("nan"), 1.0),
    (float("inf"), 1.0),
    (1.0, float("nan")),
    (1.0, float("inf")),
    (float("nan"), float("nan")),
]
NON_FINITE_IDS = ["loss=nan", "loss=inf", "grad_norm=nan", "grad_norm=inf", "both=nan"]


@pytest.mark.parametrize("loss, grad_norm", NON_FINITE, ids=NON_FINITE_IDS)
@pytest.mark.parametrize("history", ["warmed", "first-step"])
def test_non_finite_is_always_an_incident(loss, grad_norm, history):
    """NaN or inf in the loss or the grad norm is an incident even when no trigger is named, from the first step."""
    monitor = warmed(triggers=[]) if history == "warmed" else HealthMonitor(**SETTINGS, triggers=[])
    _, fired = monitor.check_step(loss, grad_norm)
    assert fired_names(fired)[:1] == ["nonfinite"] and monitor.is_incident(fired), (
        f"loss {loss}, grad norm {grad_norm} ({history}): expected the incident 'nonfinite' first, got "
        f"{fired_names(fired)}"
    )
    assert "spike" not in fired_names(fired), (
        f"a non-finite loss is not also judged as a spike: expected no 'spike', got {fired_names(fired)}"
    )


@pytest.mark.parametrize("grad_norm", [1.0, 1.1, 1.3, 0.2], ids=["at-mean", "z=3", "z=11", "falling"])
def test_grad_norm_z_is_the_distance_from_the_healthy_mean_in_stds(grad_norm):
    """z = (grad norm - mean) / std of the healthy grad norms before it, the last `window` of them;
    only a rise above the threshold warns."""
    history = [1.0 + 0.05 * (i % 2) for i in range(15)]  # 15 steps, window 10: the first 5 have left the baseline
    history[:5] = [9.0] * 5  # far from the others, so a baseline that kept them would show
    losses = [1.0] * 15
    monitor = HealthMonitor(**SETTINGS, triggers=["nonfinite", "spike"])
    for loss, norm in zip(losses, history):
        monitor.check_step(loss, norm)
    recent = history[-SETTINGS["window"] :]
    mean = statistics.fmean(recent)
    population, sample = (grad_norm - mean) / statistics.pstdev(recent), (grad_norm - mean) / statistics.stdev(recent)
    z, fired = monitor.check_step(1.0, grad_norm)
    assert z == pytest.approx(population) or z == pytest.approx(sample), (
        f"grad norm {grad_norm} against the last {SETTINGS['window']} healthy grad norms (mean {mean}): expected "
        f"z = {population:.4f} (population std) or {sample:.4f} (sample std), got {z}"
    )
    warns = z > SETTINGS["grad_z_threshold"]
    assert ("grad_z" in fired_names(fired)) == warns, (
        f"z = {z:.3f} against the threshold {SETTINGS['grad_z_threshold']}: expected "
        f"{['grad_z'] if warns else []}, got {fired_names(fired)}"
    )


def test_a_grad_norm_exactly_at_the_z_bound_does_not_warn():
    """grad_z warns when z is more than grad_z_threshold: grad norms 1 and 3 alternating (mean 2, population std 1)
    put a grad norm of 8 exactly at z = 6, the threshold: no warning; 9 is above it under either std: a warning."""
    history = [1.0, 3.0] * 5
    for grad_norm, warns in [(8.0, False), (9.0, True)]:
        monitor = after_healthy_steps([1.0] * 10, history)
        z, fired = monitor.check_step(1.0, grad_norm)
        assert ("grad_z" in fired_names(fired)) == warns, (
            f"grad norm {grad_norm} (z = {z}) against the threshold {SETTINGS['grad_z_threshold']}: "
            f"{'above it' if warns else 'at it, not above'}: expected {['grad_z'] if warns else []}, "
            f"got {fired_names(fired)}"
        )


def test_a_zero_threshold_turns_the_z_warning_off():
    """grad_z_threshold 0 means the detector is off (config.py): z is still measured, nothing warns."""
    monitor = after_healthy_steps(STEADY_LOSSES, STEADY_GRAD_NORMS, grad_z_threshold=0.0)
    z, fired = monitor.check_step(STEADY_LOSSES[-1], 10 * max(STEADY_GRAD_NORMS))
    assert z > 0 and fired == [], (
        f"with grad_z_threshold 0 the warning is off: expected z > 0 and nothing fired, got z = {z} and "
        f"{fired_names(fired)}"
    )
    healthy = monitor.take_healthy_mark()
    assert healthy, f"a step that fired nothing leaves the next checkpoint healthy: expected True, got {healthy}"


def test_z_waits_for_the_baseline_and_survives_a_constant_one():
    """Before baseline_ready() nothing is judged (z = 0, no spike); a baseline of equal grad norms (std 0) gives
    z = 0 for the same norm and fires on a higher one, without dividing by zero."""
    monitor = HealthMonitor(**SETTINGS, triggers=["nonfinite", "spike"])
    # losses 3.0 and 5.0 are above 2 x the median of the one and three losses before them: not judged yet
    for step, (loss, grad_norm) in enumerate([(1.0, 1.0), (3.0, 4.0), (1.5, 1.0), (5.0, 8.0)]):
        assert not monitor.baseline_ready(), (
            f"after {step} steps the baselines hold fewer than "
            f"{SETTINGS['window'] // 2} losses: expected {step}, got "
            f"{len(monitor.losses)}"
        )
        z, fired = monitor.check_step(loss, grad_norm)
        assert (z, fired) == (0.0, []), (
            f"step {step} (loss {loss}, grad norm {grad_norm}), before the baseline holds "
            f"{SETTINGS['window'] // 2} healthy steps, neither spike nor z is judged: expected z = 0 and nothing "
            f"fired, got z = {z} and {fired_names(fired)}"
        )
    constant = after_healthy_steps([1.0] * 5, [2.0] * 5)
    z, fired = copy.deepcopy(constant).check_step(1.0, 2.0)
    assert (z, fired) == (0.0, []), (
        f"grad norm 2.0 after five of 2.0 (std 0): expected z = 0 and nothing fired, got z = {z}, {fired_names(fired)}"
    )
    z, fired = constant.check_step(1.0, 2.5)
    assert z > SETTINGS["grad_z_threshold"] and fired_names(fired) == ["grad_z"], (
        f"grad norm 2.5 after five of 2.0 (std 0) is far out: expected z above {SETTINGS['grad_z_threshold']} "
        f"and ['grad_z'], got z = {z} and {fired_names(fired)}"
    )


def test_grad_norm_z_warns_and_marks_the_next_checkpoint_unhealthy():
    """A detector not in `triggers` warns (the next checkpoint is unhealthy); one in it is an incident, listed first."""
    monitor = warmed()
    assert monitor.take_healthy_mark(), "after healthy steps the checkpoint is healthy: expected True, got False"
    z, fired = monitor.check_step(1.0, 5.0)
    assert z > 6 and fired_names(fired) == ["grad_z"] and not monitor.is_incident(fired), (
        f"grad norm 5.0 (z = 159) with triggers nonfinite, spike: expected the warning ['grad_z'], not an "
        f"incident, got z = {z}, {fired_names(fired)}, incident {monitor.is_incident(fired)}"
    )
    healthy = monitor.take_healthy_mark()
    assert not healthy, f"the checkpoint after a warning is not a rollback target: expected False, got {healthy}"
    healthy = monitor.take_healthy_mark()
    assert healthy, f"the mark is taken once: the checkpoint after that is healthy again: expected True, got {healthy}"

    as_trigger = warmed(triggers=["spike", "grad_z"])
    _, fired = as_trigger.check_step(1.0, 5.0)
    assert as_trigger.is_incident(fired), f"grad_z named in triggers: expected an incident, got {fired}"
    assert as_trigger.take_healthy_mark(), "an incident is rolled back, not warned about: expected a healthy mark"

    spike_warns = warmed(triggers=["grad_z"])
    _, fired = spike_warns.check_step(2.5, 5.0)  # a spike (a warning here) and a grad-norm rise (an incident)
    assert fired_names(fired) == ["grad_z", "spike"] and spike_warns.is_incident(fired), (
        f"triggers grad_z only, loss 2.5 and grad norm 5.0: expected the incident first, ['grad_z', 'spike'], "
        f"got {fired_names(fired)}, incident {spike_warns.is_incident(fired)}"
    )
    assert not spike_warns.take_healthy_mark(), "the spike warned: expected the next checkpoint unhealthy"


def test_val_rise_while_train_falls():
    monitor = HealthMonitor(window=4, spike_factor=2, grad_z_threshold=0, val_rise_evals=2, triggers=["val_rise"])
    fired = []
    for train_loss, val_loss in [(3.0, 2.0), (2.5, 2.1), (2.0, 2.2)]:
        for _ in range(4):
            monitor.check_step(train_loss, 1.0)
        fired = monitor.check_eval(val_loss)
    assert fired[0][0] == "val_rise" and monitor.is_incident(fired)
    assert fired[0][1]["val_losses"] == [2.0, 2.1, 2.2]


def test_monitor_state_round_trips():
    monitor = warmed()
    twin = warmed()
    twin.check_step(1.5, 1.0)
    twin.load_state_dict(monitor.state_dict())
    assert twin.state_dict() == monitor.state_dict()


def test_unknown_trigger_is_named():
    with pytest.raises(ValueError, match="--triggers spikes"):
        HealthMonitor(10, 2.0, 6.0, 3, ["spikes"])


def test_layer_grad_norms_split_the_blocks_gradient_by_depth():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    x = torch.randint(64, (2, 8))
    model(x, x)[1].backward()
    norms = layer_grad_norms(model)
    assert len(norms) == 3 and all(n > 0 for n in norms)
    blocks = [p.grad for name, p in model.named_parameters() if name.startswith("blocks.")]
    whole = torch.cat([g.flatten() for g in blocks]).norm().item()
    assert math.sqrt(sum(n * n for n in norms)) == pytest.approx(whole, rel=1e-5)
    for p in model.blocks[1].parameters():
        p.grad = None
    assert layer_grad_norms(model)[1] == 0.0


def test_saved_activations_are_split_by_kind_and_add_up():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64))
    x = torch.randint(0, 64, (2, 16))
    with SavedActivations(model) as fp32:
        model(x, x)[1].backward()
    with SavedActivations(model) as bf16, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(x, x)[1]
    assert fp32.peak == sum(fp32.by_kind.values()) > 0 and "bfloat16" not in fp32.by_kind
    assert bf16.by_kind["bfloat16"] > 0 and sum(bf16.by_kind.values()) == bf16.peak  # nothing freed yet: all at once
    matrices = {p.shape for p in model.parameters() if p.dim() == 2}
    with SavedActivations(model, kind=lambda t: "matrix-shaped" if t.shape in matrices else "other") as named:
        model(x, x)
    assert set(named.by_kind) <= {"matrix-shaped", "other"} and sum(named.by_kind.values()) == named.peak
    del loss
