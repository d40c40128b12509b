"""The exercises: a student copy starts with every exercise not attempted; the graders pass the
project's own bodies and catch the classic wrong ones, planted in a copy."""

import sys

import pytest

from conftest import ROOT, run_script

sys.path.insert(0, str(ROOT / "exercises"))
from catalog import BY_NAME, body, indent_of, replace_body  # noqa: E402

# The classic mistakes, one per exercise: (what it gets wrong, the wrong body at indent 0).
PLANTED = {
    "next_batch": ("every rank reads the same rows", """\
B, T = self.batch_size, self.block_size
starts = [self.window(self.position + b) * T for b in range(B)]
rows = np.stack([self.tokens[s : s + T + 1] for s in starts]).astype(np.int64)
self.position += self.world_size * B
return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())
"""),
    "init": ("no depth scaling of the residual projections", """\
C = self.config.n_embd
if isinstance(module, nn.Embedding):
    nn.init.normal_(module.weight, std=self.embedding_std(C))
elif isinstance(module, nn.Linear) and module is not self.lm_head:
    nn.init.normal_(module.weight, std=self.init_std(C))
"""),
    "clm_loss": ("the sum, not the mean", """\
return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
"""),
    "lr_at": ("warmup off by one: step 0 gets no learning rate", """\
decay_iters = cfg.lr_decay_iters or cfg.max_iters
if step < cfg.warmup_iters:
    return cfg.learning_rate * step / cfg.warmup_iters
if step >= decay_iters:
    return cfg.min_lr
progress = (step - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
return cfg.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)
"""),
    "clip_gradients": ("each tensor clipped to max_norm on its own", """\
if max_norm > 0:
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(torch.clamp(max_norm / (p.grad.norm() + 1e-6), max=1.0))
"""),
    "check_step": ("a NaN loss is caught, an infinite grad norm is not", """\
fired = []
z = 0.0
if self.baseline_ready():
    mean, std = statistics.fmean(self.grad_norms), statistics.pstdev(self.grad_norms)
    z = (grad_norm - mean) / max(std, 1e-8) if math.isfinite(grad_norm) else 0.0
if not math.isfinite(loss):
    fired.append(("nonfinite", {"loss": str(loss), "grad_norm": str(grad_norm)}))
elif self.baseline_ready() and loss > self.spike_factor * statistics.median(self.losses):
    fired.append(("spike", {"loss": loss, "baseline": statistics.median(self.losses), "factor": self.spike_factor}))
if self.grad_z_threshold and z > self.grad_z_threshold:
    fired.append(("grad_z", {"grad_norm": grad_norm, "z": z, "threshold": self.grad_z_threshold}))
if not fired:
    self.losses.append(loss)
    self.grad_norms.append(grad_norm)
return z, self._sort(fired)
"""),
    "dp_average": ("gradients summed over the ranks, not averaged", """\
for i in range(len(self.buckets)):
    if i not in self.in_flight and self.mode == "bucketed":
        self._launch(i)
if self.mode == "naive":
    for p in self.params:
        dist.all_reduce(p.grad, group=self.group)
for flat, work in self.in_flight.values():
    work.wait()
self.in_flight.clear()
self.ready = [0] * len(self.buckets)
"""),
    "one_f_one_b": ("all forwards first: GPipe under another name", """\
return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
"""),
    "flops_per_token": ("6 N alone, without attention", """\
return 6 * (parameters_on_rank(mc) - mc.block_size * mc.n_embd)
"""),
}


def grade(root, *names):
    return run_script([ROOT / "exercises" / "grade.py", "--root", root, *names], cwd=root, timeout=600)


def student_copy(tmp_path, *names):
    out = tmp_path / "student"
    made = run_script([ROOT / "exercises" / "make.py", out, "--only", ",".join(names)], cwd=ROOT)
    assert made.returncode == 0, made.stderr
    return out


def write_body(root, name, lines):
    path = root / BY_NAME[name].file
    source = path.read_text()
    path.write_text(replace_body(source, name, [indent_of(source, name) + line if line.strip() else line
                                                for line in lines]))


def reference_body(name):
    _, lines, _ = body((ROOT / BY_NAME[name].file).read_text(), name)
    indent = indent_of((ROOT / BY_NAME[name].file).read_text(), name)
    return [line.removeprefix(indent) for line in lines]


def test_a_student_copy_starts_with_nothing_attempted(tmp_path):
    out = student_copy(tmp_path, *BY_NAME)
    result = grade(out)
    assert result.returncode == 1
    assert result.stdout.count("not attempted") == len(BY_NAME), result.stdout
    for name in BY_NAME:  # the stub keeps the signature and docstring, and names the exercise
        assert f'NotImplementedError("exercise {name}:' in (out / BY_NAME[name].file).read_text()


def test_one_reference_body_makes_exactly_that_exercise_pass(tmp_path):
    out = student_copy(tmp_path, *BY_NAME)
    write_body(out, "lr_at", reference_body("lr_at"))
    result = grade(out)
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and [line.split()[1] for line in lines if " passed " in line] == ["lr_at"], lines
    assert sum("not attempted" in line for line in lines) == len(BY_NAME) - 1


def test_a_test_that_needs_another_stub_waits_on_it(tmp_path):
    """init's tests run the model's forward, which needs clm_loss: while that is a stub, init waits on it."""
    out = student_copy(tmp_path, "init", "clm_loss")
    write_body(out, "init", reference_body("init"))
    result = grade(out, "init")
    assert "waiting" in result.stdout and "on exercise clm_loss" in result.stdout, result.stdout


@pytest.mark.parametrize("name", list(PLANTED))
def test_the_grader_catches_the_classic_mistake_and_passes_the_reference(tmp_path, name):
    mistake, wrong = PLANTED[name]
    out = student_copy(tmp_path, name)
    write_body(out, name, wrong.splitlines(keepends=True))
    result = grade(out, name)
    assert result.returncode == 1 and " failed " in result.stdout, f"{mistake} was not caught:\n{result.stdout}"
    write_body(out, name, reference_body(name))
    result = grade(out, name)
    assert result.returncode == 0 and " passed " in result.stdout, result.stdout + result.stderr
