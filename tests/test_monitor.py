import math

import pytest
import torch

from model import GPT, GPTConfig
from monitor import HealthMonitor, layer_grad_norms


def warmed(triggers=("nonfinite", "spike"), **overrides):
    settings = dict(window=10, spike_factor=2.0, grad_z_threshold=6.0, val_rise_evals=3)
    monitor = HealthMonitor(**{**settings, **overrides}, triggers=list(triggers))
    for i in range(10):
        assert monitor.check_step(1.0 + 0.01 * (i % 3), 1.0 + 0.05 * (i % 2)) == (pytest.approx(0, abs=2), [])
    return monitor


def test_spike_is_judged_against_the_recent_median():
    monitor = warmed()
    _, fired = monitor.check_step(1.9, 1.0)
    assert fired == []  # below 2 x median: noise, not a spike
    _, fired = monitor.check_step(2.5, 1.0)
    assert fired[0][0] == "spike" and monitor.is_incident(fired)
    assert fired[0][1]["baseline"] == pytest.approx(1.01, abs=0.01)


def test_non_finite_is_always_an_incident():
    monitor = warmed(triggers=[])
    _, fired = monitor.check_step(float("nan"), 1.0)
    assert fired[0][0] == "nonfinite" and monitor.is_incident(fired)
    _, fired = monitor.check_step(1.0, float("inf"))
    assert fired[0][0] == "nonfinite"


def test_grad_norm_z_warns_and_marks_the_next_checkpoint_unhealthy():
    monitor = warmed()
    assert monitor.take_healthy_mark()
    z, fired = monitor.check_step(1.0, 5.0)
    assert z > 6 and fired[0][0] == "grad_z" and not monitor.is_incident(fired)
    assert not monitor.take_healthy_mark()  # the checkpoint after a warning is not a rollback target
    assert monitor.take_healthy_mark()
    as_trigger = warmed(triggers=["spike", "grad_z"])
    assert as_trigger.is_incident(as_trigger.check_step(1.0, 5.0)[1])


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
