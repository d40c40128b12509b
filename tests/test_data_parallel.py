"""Training under data, tensor and pipeline parallelism with real gloo processes: any layout takes the
single-process step."""

import json
import shutil
from functools import partial

import pytest
import torch
from conftest import ROOT, run_script, write_word_corpus

import train
from machinery.components import checkpoint
from machinery.job.config import parse_args
from machinery.job.local_ranks import run_ranks
from machinery.planning import closed_forms
from model import GPT, GPTConfig
from parallel.grid import Layout, ProcessGrid
from parallel.layout import check_layout
from parallel.optimizer import adamw

# fp32 pinned: the layouts agree to rounding in fp32; under bf16 (the default on CPUs that have it) they
# would differ by bf16's rounding of differently split matmuls
# fmt: off
MODEL = [
    "--dtype", "float32", "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32",
    "--max_iters", "20", "--warmup_iters", "5", "--learning_rate", "3e-3", "--log_interval", "1",
    "--eval_interval", "10", "--eval_iters", "2", "--ckpt_interval", "5", "--max_new_tokens", "10",
    "--num_samples", "1", "--plot", "false", "--dist_timeout", "30",
]
# fmt: on


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    write_word_corpus(root / "corpus.txt", 3000)
    # fmt: off
    train.main(
        [
            "--source", str(root / "corpus.txt"), "--data_dir", str(root / "data"),
            "--out_dir", str(root / "warmup"), "--max_iters", "1", "--n_layer", "1", "--n_embd", "16",
            "--n_head", "1",
        ]
    )
    # fmt: on
    return root  # data prepared once, so ranks never race to prepare it


def args(corpus, out, *extra):
    # fmt: off
    return [
        "--source", str(corpus / "corpus.txt"), "--data_dir", str(corpus / "data"), "--out_dir", str(out),
        *MODEL,
        *map(str, extra),
    ]
    # fmt: on


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights(out):
    _, state = checkpoint.load_latest(out / "ckpt")
    return state["step"], state["model"]


def assert_same_run(out, reference, exact=False):
    got, want = metrics(out), metrics(reference)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for key in ("loss", "val_loss", "grad_norm", "lr"):
        a = torch.tensor([r.get(key, 0.0) for r in got], dtype=torch.float64)
        b = torch.tensor([r.get(key, 0.0) for r in want], dtype=torch.float64)
        if exact:
            assert torch.equal(a, b), key
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=key)
    (step_a, weights_a), (step_b, weights_b) = final_weights(out), final_weights(reference)
    assert step_a == step_b
    for name in weights_b:
        if exact:
            assert torch.equal(weights_a[name], weights_b[name]), name
        else:
            torch.testing.assert_close(weights_a[name], weights_b[name], rtol=1e-4, atol=1e-5, msg=name)


def train_ranks(world_size, argv, timeout=120):
    outcome = run_ranks(world_size, train.main, argv, timeout=timeout)
    assert all(status == "ok" for status, _ in outcome.values()), outcome
    return outcome


@pytest.fixture(scope="module")
def single(corpus):
    """The reference: one process, 8 sequences per step."""
    out = corpus / "single"
    train.main(args(corpus, out, "--batch_size", 8))
    return out


# every layout against one process: name -> (ranks, flags)
LAYOUTS = {
    "dp2": (2, ["--batch_size", 4]),
    "dp4": (4, ["--batch_size", 2]),
    "dp2-accumulation": (2, ["--batch_size", 2, "--gradient_accumulation_steps", 2]),
    "dp2-naive": (2, ["--batch_size", 4, "--dp_mode", "naive"]),
    "tp2": (2, ["--batch_size", 8, "--dp", 1, "--tp", 2]),
    "dp2xtp2": (4, ["--batch_size", 4, "--dp", 2, "--tp", 2]),
    "pp2-gpipe": (2, ["--batch_size", 8, "--dp", 1, "--pp", 2, "--micro_batches", 4, "--schedule", "gpipe"]),
    "dp2xpp2-1f1b": (4, ["--batch_size", 4, "--dp", 2, "--pp", 2, "--micro_batches", 2, "--schedule", "1f1b"]),
    "tp2xpp2-gpipe": (
        4,
        ["--batch_size", 8, "--dp", 1, "--tp", 2, "--pp", 2, "--micro_batches", 2, "--schedule", "gpipe"],
    ),
    "dp2xtp2xpp2-gpipe": (
        8,
        ["--batch_size", 4, "--dp", 2, "--tp", 2, "--pp", 2, "--micro_batches", 2, "--schedule", "gpipe"],
    ),
    "dp2xtp2xpp2-1f1b": (
        8,
        ["--batch_size", 4, "--dp", 2, "--tp", 2, "--pp", 2, "--micro_batches", 2, "--schedule", "1f1b"],
    ),
    "dp2-zero1": (2, ["--batch_size", 4, "--zero", 1]),
    "dp2-zero2": (2, ["--batch_size", 4, "--zero", 2]),
    "dp4-zero1": (4, ["--batch_size", 2, "--zero", 1]),
    "dp4-zero2": (4, ["--batch_size", 2, "--zero", 2]),
    "dp2-accumulation-zero2": (2, ["--batch_size", 2, "--gradient_accumulation_steps", 2, "--zero", 2]),
    "dp2xtp2-zero1": (4, ["--batch_size", 4, "--dp", 2, "--tp", 2, "--zero", 1]),
    "dp2xpp2-zero1": (4, ["--batch_size", 4, "--dp", 2, "--pp", 2, "--micro_batches", 2, "--zero", 1]),
    "recompute": (1, ["--batch_size", 8, "--recompute"]),
    "dp2xtp2-recompute": (4, ["--batch_size", 4, "--dp", 2, "--tp", 2, "--recompute"]),
    "dp2xtp2-zero2": (4, ["--batch_size", 4, "--dp", 2, "--tp", 2, "--zero", 2]),
    "dp2xpp2-zero1-recompute": (
        4,
        ["--batch_size", 4, "--dp", 2, "--pp", 2, "--micro_batches", 2, "--zero", 1, "--recompute"],
    ),
    # sequence parallelism: the norm regions cut along the sequence, beside data parallelism, ZeRO and pipelines
    "tp2-sp": (2, ["--batch_size", 8, "--dp", 1, "--tp", 2, "--sequence_parallel"]),
    "dp2xtp2-sp": (4, ["--batch_size", 4, "--dp", 2, "--tp", 2, "--sequence_parallel"]),
    "dp2xtp2-sp-zero2": (4, ["--batch_size", 4, "--dp", 2, "--tp", 2, "--sequence_parallel", "--zero", 2]),
    "tp2xpp2-sp": (
        4,
        ["--batch_size", 8, "--dp", 1, "--tp", 2, "--pp", 2, "--micro_batches", 2, "--sequence_parallel"],
    ),
    "dp2xtp2xpp2-sp": (
        8,
        ["--batch_size", 4, "--dp", 2, "--tp", 2, "--pp", 2, "--micro_batches", 2, "--sequence_parallel"],
    ),
    "tp2-sp-recompute": (2, ["--batch_size", 8, "--dp", 1, "--tp", 2, "--sequence_parallel", "--recompute"]),
    # context parallelism: each sequence cut across the ranks, attention around a ring; alone, and in 4D
    "cp2": (2, ["--batch_size", 8, "--dp", 1, "--cp", 2]),
    "cp4": (4, ["--batch_size", 8, "--dp", 1, "--cp", 4]),
    "dp2xcp2": (4, ["--batch_size", 4, "--dp", 2, "--cp", 2]),
    "tp2xcp2": (4, ["--batch_size", 8, "--dp", 1, "--tp", 2, "--cp", 2]),
    "pp2xcp2": (4, ["--batch_size", 8, "--dp", 1, "--pp", 2, "--micro_batches", 2, "--cp", 2]),
    "dp2xtp2xcp2": (8, ["--batch_size", 4, "--dp", 2, "--tp", 2, "--cp", 2]),
    "tp2xcp2-sp": (4, ["--batch_size", 8, "--dp", 1, "--tp", 2, "--cp", 2, "--sequence_parallel"]),
    "dp2xcp2-zero1-recompute": (4, ["--batch_size", 4, "--dp", 2, "--cp", 2, "--zero", 1, "--recompute"]),
}
# the default run's representatives: all three dimensions at once, ZeRO, recomputation; the rest: -m integration
IN_THE_DEFAULT_RUN = ("dp2xtp2xpp2-1f1b", "dp2-zero2", "recompute", "tp2-sp", "cp2")


@pytest.mark.parametrize(
    "world_size, extra",
    [
        pytest.param(*layout, id=name, marks=() if name in IN_THE_DEFAULT_RUN else pytest.mark.integration)
        for name, layout in LAYOUTS.items()
    ],
)
def test_layout_matches_single_process(corpus, single, world_size, extra):
    """Same seed, same global batch: every layout takes the single process's steps (fp32 tolerance)."""
    check_layout_takes_the_steps_of(single, corpus, world_size, extra)


# the llama arch (rotary positions, SwiGLU, grouped-query attention, q/k/v biases, an untied head) on every kind of
# layout: data parallelism (ours, ZeRO, torch's DDP and FSDP2), tensor parallelism with the key/value heads split
# (n_head 4, n_kv_head 2 over tp 2), pipelines, 3D, and recomputation
LLAMA = ["--arch", "llama", "--n_head", 4, "--n_kv_head", 2, "--qkv_bias", "--tie_embeddings", "false"]
LLAMA_LAYOUTS = {
    "llama-dp2xtp2": (4, ["--batch_size", 4, "--dp", 2, "--tp", 2]),
    "llama-pp2": (2, ["--batch_size", 8, "--dp", 1, "--pp", 2, "--micro_batches", 2]),
    "llama-dp2xtp2xpp2-1f1b": (
        8,
        ["--batch_size", 4, "--dp", 2, "--tp", 2, "--pp", 2, "--micro_batches", 2, "--schedule", "1f1b"],
    ),
    "llama-tp2-recompute": (2, ["--batch_size", 8, "--dp", 1, "--tp", 2, "--recompute"]),
    "llama-dp2-zero2": (2, ["--batch_size", 4, "--zero", 2]),
    "llama-dp2-zero1": (2, ["--batch_size", 4, "--zero", 1]),
    "llama-dp2-ddp": (2, ["--batch_size", 4, "--dp_mode", "ddp"]),
    "llama-dp2-fsdp": (2, ["--batch_size", 4, "--dp_mode", "fsdp"]),
    "llama-recompute": (1, ["--batch_size", 8, "--recompute"]),
    "llama-dp2xtp2-sp": (4, ["--batch_size", 4, "--dp", 2, "--tp", 2, "--sequence_parallel"]),
    "llama-cp2": (2, ["--batch_size", 8, "--dp", 1, "--cp", 2]),
    "llama-tp2xcp2": (4, ["--batch_size", 8, "--dp", 1, "--tp", 2, "--cp", 2]),
    "llama-pp2xcp2": (4, ["--batch_size", 8, "--dp", 1, "--pp", 2, "--micro_batches", 2, "--cp", 2]),
}


@pytest.fixture(scope="module")
def single_llama(corpus):
    out = corpus / "single-llama"
    train.main(args(corpus, out, "--batch_size", 8, *LLAMA))
    return out


@pytest.mark.parametrize(
    "world_size, extra",
    [
        pytest.param(*layout, id=name, marks=() if name == "llama-dp2xtp2" else pytest.mark.integration)
        for name, layout in LLAMA_LAYOUTS.items()
    ],
)
def test_llama_layout_matches_single_process(corpus, single_llama, world_size, extra):
    check_layout_takes_the_steps_of(single_llama, corpus, world_size, [*LLAMA, *extra])


@pytest.mark.integration
def test_sequence_parallel_on_tp4_matches_single_process(corpus):
    """tp 4 needs 4 heads: a reference of its own, and T/4 = 8 positions a rank."""
    four_heads = ["--n_head", 4]
    out = corpus / "single-four-heads"
    train.main(args(corpus, out, "--batch_size", 8, *four_heads))
    check_layout_takes_the_steps_of(
        out, corpus, 4, [*four_heads, "--batch_size", 8, "--dp", 1, "--tp", 4, "--sequence_parallel"]
    )


FOUR_LAYERS = ["--n_layer", 4]  # interleaving cuts the layers into pp x v = 4 chunks


@pytest.fixture(scope="module")
def single_four_layers(corpus):
    out = corpus / "single-four-layers"
    train.main(args(corpus, out, "--batch_size", 8, *FOUR_LAYERS))
    return out


INTERLEAVED = {  # pp2 with v = 2 chunks a rank: each micro-batch goes around the two ranks twice
    "pp2-v2-m2": (2, ["--micro_batches", 2]),
    "pp2-v2-m4": (2, ["--micro_batches", 4]),
    "dp2xpp2-v2-zero1": (4, ["--dp", 2, "--batch_size", 4, "--micro_batches", 2, "--zero", 1]),
    "tp2xpp2-v2-sp": (4, ["--tp", 2, "--micro_batches", 4, "--sequence_parallel"]),
}


@pytest.mark.parametrize(
    "world_size, extra",
    [
        pytest.param(*layout, id=name, marks=() if name == "pp2-v2-m4" else pytest.mark.integration)
        for name, layout in INTERLEAVED.items()
    ],
)
def test_interleaved_pipeline_matches_single_process(corpus, single_four_layers, world_size, extra):
    flags = ["--batch_size", 8, "--dp", 1, "--pp", 2, "--virtual_stages", 2, *FOUR_LAYERS, *extra]
    check_layout_takes_the_steps_of(single_four_layers, corpus, world_size, flags)


@pytest.mark.integration
@pytest.mark.parametrize("before, after", [(2, 1), (1, 2)], ids=["v2-to-v1", "v1-to-v2"])
def test_an_interleaved_run_resumes_on_other_layouts(corpus, single_four_layers, before, after):
    """A pp2 run with `before` chunks a rank loses a rank at step 13; its single-device checkpoint of step 10
    goes on with `after` chunks a rank, with the uninterrupted run's losses and weights."""
    out = corpus / f"pp2-v{before}-then-v{after}"
    pipeline = ["--batch_size", 8, "--dp", 1, "--pp", 2, "--micro_batches", 2, *FOUR_LAYERS]
    outcome = run_ranks(
        2, train.main, args(corpus, out, *pipeline, "--virtual_stages", before, "--inject", "crash@13"), timeout=120
    )
    assert outcome[1] == ("missing", -9), outcome  # the last rank was SIGKILLed
    train_ranks(2, args(corpus, out, *pipeline, "--virtual_stages", after))
    assert_same_run(out, single_four_layers)


def check_layout_takes_the_steps_of(single, corpus, world_size, extra):
    """A run of `extra`'s layout logs the reference's losses and ends on its weights, and counts the bytes and the
    state the closed forms say."""
    out = corpus / f"ranks{world_size}-{'-'.join(map(str, extra))}"
    argv = args(corpus, out, "--dp", world_size, "--bucket_mb", 0.01, *extra)
    if world_size == 1:  # in this process: a forked child of a process that trained before hangs in OpenMP
        train.main(argv)
    else:
        train_ranks(world_size, argv)
    assert_same_run(out, single)
    # every step logs its communication, each dimension on its busiest rank, as the closed form says
    _, _, configs = parse_args(argv)
    layout, cfg = configs.parallel, configs.train
    closed_form = closed_forms.busiest_stage_comm_bytes(
        configs.model, layout, batch_size=cfg.batch_size, accumulation=cfg.gradient_accumulation_steps, compute_bytes=4
    )
    # the state at the first update, on the fullest rank, as the closed form says (ZeRO: up to its padding,
    # under dp elements per bucket)
    (state,) = [r["state_bytes"] for r in metrics(out) if "state_bytes" in r]
    state_closed_form = closed_forms.fullest_rank_state_bytes(configs.model, layout)  # FSDP2: ZeRO's stage 3
    padding = 16 * layout.dp * len(list(GPT(configs.model).parameters())) if layout.zero_stage else 0
    assert state_closed_form <= state <= state_closed_form + padding
    for record in metrics(out)[:-1] if world_size > 1 else []:  # the last holds the final val loss only
        assert {d: record[f"comm_bytes_{d}"] for d in closed_form} == {d: b for d, (b, _) in closed_form.items()}


def first_values(tensor_or_list):
    return [round(v, 6) for v in torch.as_tensor(tensor_or_list).flatten()[:3].tolist()]


def test_bucketed_and_naive_average_to_the_same_gradients():
    """Compare the two modes directly on one backward, gradient by gradient; bucketed DP's
    gradients are views into its buckets, and stay right after either way of zeroing them."""
    outcome = run_ranks(2, _one_backward_both_modes, timeout=60)
    for rank in range(2):
        status, value = outcome.get(rank, ("missing", None))
        assert status == "ok", f"both ranks finish a backward in each mode: rank {rank} ended {status}: {value}"
    (grads0, views0), (grads1, _) = outcome[0][1], outcome[1][1]
    for number, (bucketed, naive, *again) in enumerate(grads0):
        close = torch.allclose(torch.tensor(bucketed), torch.tensor(naive), rtol=1e-5, atol=1e-7)
        assert close, (
            f"parameter {number}: bucketed and naive DP average to the same gradient: expected (naive) "
            f"{first_values(naive)}..., got (bucketed) {first_values(bucketed)}..."
        )
        for zeroing, repeat in zip(("dp.clear_gradients()", "set_to_none"), again):
            assert repeat == bucketed, (
                f"parameter {number}: the same backward after {zeroing} gives the same "
                f"average: expected {first_values(bucketed)}..., got {first_values(repeat)}..."
            )
    for number, (a, b) in enumerate(zip(grads0, grads1)):
        assert a[0] == b[0], (
            f"parameter {number}: both ranks hold the same average: rank 0 {first_values(a[0])}"
            f"..., rank 1 {first_values(b[0])}..."
        )
    assert views0 == [True] * 3, (
        f"after finish() every gradient is still a view into its bucket (after no "
        f"zeroing, dp.clear_gradients(), set_to_none): expected [True, True, True], got {views0}"
    )


def _one_backward_both_modes():
    from model import GPT, GPTConfig
    from parallel.data_parallel import BucketedDataParallel, NaiveDataParallel
    from parallel.grid import destroy_distributed, init_distributed

    launch = init_distributed(30)
    grid = ProcessGrid(Layout(dp=2), launch.rank, launch.world_size)
    grads, views = {}, []
    engines = {"bucketed": partial(BucketedDataParallel, bucket_mb=0.002), "naive": NaiveDataParallel}
    for mode, zeroings in (("bucketed", ("none", "dp.clear_gradients", "set_to_none")), ("naive", ("none",))):
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=16))
        dp = engines[mode](model, grid)
        torch.manual_seed(1 + launch.rank)  # each rank its own data
        x = torch.randint(64, (2, 16))
        for zeroing in zeroings:
            if zeroing == "dp.clear_gradients":
                dp.clear_gradients()
            elif zeroing == "set_to_none":
                model.zero_grad(set_to_none=True)
            model(x, x)[1].backward()
            dp.finish()
            grads.setdefault(mode, []).append([p.grad.flatten().tolist() for p in model.parameters()])
            if mode == "bucketed":
                flat_of = {p: dp.flats[i] for p, i in dp.buckets.index.items()}
                views.append(
                    all(
                        p.grad.untyped_storage().data_ptr() == flat_of[p].untyped_storage().data_ptr()
                        for p in model.parameters()
                    )
                )
    destroy_distributed()
    first, *again = grads["bucketed"]  # per parameter: (bucketed, naive, bucketed after each zeroing)
    return [(b, n, *rest) for b, n, *rest in zip(first, grads["naive"][0], *again)], views


class ThreeLayersAndAnUnusedOne(torch.nn.Module):
    """A small net whose `unused` layer gets no gradient: it shares the last bucket with fc1, so that bucket's
    hooks never all fire and finish() must send it itself."""

    def __init__(self):
        super().__init__()
        self.fc1, self.unused = torch.nn.Linear(8, 16), torch.nn.Linear(4, 4)
        self.fc2, self.fc3 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):  # (B, 8) -> (B, 4)
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def _data(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)  # every rank, every step its own rows
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


DP_SETUPS = {
    "bucketed": ("bucketed", {"overlap": True}),
    "bucketed-no-overlap": ("bucketed", {"overlap": False}),
    "naive": ("naive", {}),
}


def _dp_average_over_steps(steps):
    """On 4 ranks as dp 2 x pp 2 (DP groups {0, 2} and {1, 3}): each setup of a DP engine over `steps` steps,
    each rank with its own data. Per setup and step: this rank's gradients after finish(), the average of
    its DP group's gradients computed here from the group's data on an unwrapped twin, and the DP bytes
    sent during backward and in the whole step."""
    import copy

    from parallel.comm_count import take_comm_bytes
    from parallel.data_parallel import BucketedDataParallel, NaiveDataParallel, clear_gradients
    from parallel.grid import destroy_distributed, init_distributed

    launch = init_distributed(20)
    grid = ProcessGrid(Layout(dp=2, pp=2), launch.rank, launch.world_size)
    # buckets of 1000 B: fc3 and fc2 (1360 B) fill the first, the unused layer and fc1 (656 B) the last
    engines = {"bucketed": partial(BucketedDataParallel, bucket_mb=1000 / 2**20), "naive": NaiveDataParallel}
    results = {}
    for setup, (mode, options) in DP_SETUPS.items():
        torch.manual_seed(0)
        net = ThreeLayersAndAnUnusedOne()
        twin = copy.deepcopy(net)
        dp = engines[mode](net, grid, **options)
        for step in range(steps):
            clear_gradients(net, dp)
            take_comm_bytes()
            x, y = _data(launch.rank, step)
            torch.nn.functional.mse_loss(net(x), y).backward()
            sent_in_backward = take_comm_bytes()["dp"]
            dp.finish()
            sent_in_step = sent_in_backward + take_comm_bytes()["dp"]
            want = {name: torch.zeros_like(p) for name, p in twin.named_parameters()}
            for peer in grid.dp_ranks:
                twin.zero_grad(set_to_none=True)
                peer_x, peer_y = _data(peer, step)
                torch.nn.functional.mse_loss(twin(peer_x), peer_y).backward()
                for name, p in twin.named_parameters():
                    if p.grad is not None:
                        want[name] += p.grad / grid.dp
            got = {
                name: (torch.zeros_like(p) if p.grad is None else p.grad).tolist() for name, p in net.named_parameters()
            }
            results[setup, step] = dict(
                got=got,
                want={name: g.tolist() for name, g in want.items()},
                sent_in_backward=sent_in_backward,
                sent_in_step=sent_in_step,
            )
    destroy_distributed()
    return results


def test_finish_leaves_the_group_average_on_every_step():
    """finish() of BucketedDataParallel and NaiveDataParallel on dp 2 x pp 2: after every step each gradient
    is the average over this rank's DP group (not the world), whether the hooks sent a bucket during backward,
    finish() had to send it (a parameter without gradient, or overlap=False as under pipelines), or the naive
    engine sent each gradient;
    bucketed DP sends each gradient once per step, and every complete bucket during backward, on every step;
    naive DP's all-reduces go through the communication counter too."""
    steps = 3
    outcome = run_ranks(4, _dp_average_over_steps, steps, timeout=60)
    net = ThreeLayersAndAnUnusedOne()
    numel = sum(p.numel() for p in net.parameters())
    with_grad = numel - sum(p.numel() for p in net.unused.parameters())  # naive may skip the unused layer
    for rank in range(4):
        status, results = outcome.get(rank, ("missing", None))
        assert status == "ok", f"every rank finishes its steps: rank {rank} ended {status}: {results}"
        for (setup, step), r in results.items():
            for name, want in r["want"].items():
                got = torch.tensor(r["got"][name])
                close = torch.allclose(got, torch.tensor(want), rtol=1e-5, atol=1e-7)
                assert close, (
                    f"{setup}, step {step}, rank {rank}: {name}'s gradient is the average over the "
                    f"DP group's 2 ranks: expected {first_values(want)}..., got {first_values(got)}..."
                )
            if setup.startswith("bucketed"):
                assert r["sent_in_step"] == 4 * numel, (
                    f"{setup}, step {step}: each fp32 gradient is sent once per step: expected {4 * numel} bytes, "
                    f"got {r['sent_in_step']}"
                )
            else:
                assert 4 * with_grad <= r["sent_in_step"] <= 4 * numel, (
                    f"{setup}, step {step}: each fp32 gradient's all-reduce is counted (comm_count.counted), once: "
                    f"expected {4 * with_grad} bytes ({4 * numel} if the unused layer's zeros are sent too), "
                    f"got {r['sent_in_step']}"
                )
        first = results["bucketed", 0]["sent_in_backward"]
        assert 0 < first < 4 * numel, (
            f"rank {rank}: the complete bucket is sent during backward, the one "
            f"with the unused layer in finish(): expected between 0 and {4 * numel} "
            f"bytes during the first backward, got {first}"
        )
        for step in range(1, steps):
            again = results["bucketed", step]["sent_in_backward"]
            assert again == first, (
                f"rank {rank}, step {step}: the hooks send the complete buckets during "
                f"backward on every step, as on the first: expected {first} bytes, got {again}"
            )


class FrozenBufferAndTied(torch.nn.Module):
    """What a GPT does not have and other models do (CS336's DDP test's ToyModel has the first): a frozen,
    randomly drawn bias, a buffer that forward reads and never updates, and one matrix used twice (the
    embedding and the head, tied)."""

    def __init__(self):
        super().__init__()
        self.embed, self.fc = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8)
        self.frozen_bias = torch.nn.Parameter(torch.randn(8), requires_grad=False)
        self.register_buffer("scale", torch.rand(8) + 0.5)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx):  # (B, T) -> (B, T, 16)
        return self.head(torch.tanh(self.fc(self.embed(idx)) + self.frozen_bias) * self.scale)


DP_ENGINES = ("naive", "bucketed", "zero1", "zero2")


def _engine(name):
    from parallel.data_parallel import BucketedDataParallel, NaiveDataParallel
    from parallel.zero import Zero1DataParallel, Zero2DataParallel

    small = 300 / 2**20  # buckets of 300 B: several, so that a bucket boundary falls between the parameters
    return {
        "naive": NaiveDataParallel,
        "bucketed": partial(BucketedDataParallel, bucket_mb=small),
        "zero1": partial(Zero1DataParallel, bucket_mb=small),
        "zero2": partial(Zero2DataParallel, bucket_mb=small),
    }[name]


def _toy_batch(step):
    g = torch.Generator().manual_seed(100 + step)  # the same global batch on every rank
    return torch.randint(16, (4, 6), generator=g)  # (B, T): each of 2 ranks takes 2 rows


def _toy_loss(net, idx):
    logits = net(idx[:, :-1])  # (B, T-1, 16)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())


def _toy_state(net):
    return {name: t.detach().clone().tolist() for name, t in net.state_dict(keep_vars=True).items()}


def _toy_optimizer(net, make):
    decayed = [p for p in net.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in net.parameters() if p.requires_grad and p.dim() < 2]
    return make([(decayed, 0.1), (other, 0.0)], lr=0.05)


def _toy_steps(engine, steps):
    """Rank r builds the toy from seed r (so the ranks start apart), wraps it in the engine, then takes
    `steps` steps of the engine's own optimizer on its half of each batch. Returns its state before and
    after wrapping, and after the steps."""
    from parallel.grid import destroy_distributed, init_distributed

    launch = init_distributed(30)
    grid = ProcessGrid(Layout(dp=2), launch.rank, launch.world_size)
    torch.manual_seed(launch.rank)
    net = FrozenBufferAndTied()
    before = _toy_state(net)
    dp = _engine(engine)(net, grid)
    wrapped = _toy_state(net)
    optimizer = _toy_optimizer(net, dp.optimizer if engine.startswith("zero") else adamw)  # ZeRO's: its pieces
    for step in range(steps):
        rows = _toy_batch(step)[2 * grid.dp_rank : 2 * grid.dp_rank + 2]  # this rank's half
        _toy_loss(net, rows).backward()
        dp.finish()
        optimizer.step()
        dp.clear_gradients()
    destroy_distributed()
    return before, wrapped, _toy_state(net)


@pytest.mark.parametrize("engine", DP_ENGINES)
def test_every_engine_starts_the_replicas_from_rank_0s_whole_state(engine):
    """Each hand-written DP engine, wrapping a module with a frozen parameter, a buffer and a tied matrix on 2 gloo
    ranks that drew their own values: after wrapping every rank holds rank 0's whole state (frozen parameter and
    buffer too), and five steps of the engine's own optimizer on each rank's half of a batch equal one process
    taking AdamW's steps on the whole batch."""
    steps = 5
    outcome = run_ranks(2, _toy_steps, engine, steps, timeout=60)
    for rank in range(2):
        status, value = outcome.get(rank, ("missing", None))
        assert status == "ok", f"{engine}: both ranks wrap and take {steps} steps: rank {rank} ended {status}: {value}"
    (before0, wrapped0, _), (before1, wrapped1, _) = outcome[0][1], outcome[1][1]
    assert before1["frozen_bias"] != before0["frozen_bias"], "the ranks draw their own values before wrapping"
    for name, want in before0.items():
        assert wrapped0[name] == want, f"{engine}: wrapping leaves rank 0's {name} as it was"
        assert wrapped1[name] == want, (
            f"{engine}: after wrapping rank 1 holds rank 0's {name}: expected {first_values(want)}..., "
            f"got {first_values(wrapped1[name])}..."
        )
    torch.manual_seed(0)
    net = FrozenBufferAndTied()  # rank 0's draw
    optimizer = _toy_optimizer(net, adamw)
    for step in range(steps):
        _toy_loss(net, _toy_batch(step)).backward()
        optimizer.step()
        net.zero_grad(set_to_none=True)
    for rank in range(2):
        stepped = outcome[rank][1][2]
        for name, want in _toy_state(net).items():
            torch.testing.assert_close(
                torch.tensor(stepped[name]),
                torch.tensor(want),
                rtol=1e-5,
                atol=1e-6,
                msg=f"{engine}, rank {rank}: after {steps} steps {name} equals one process's on the whole batch: "
                f"expected {first_values(want)}..., got {first_values(stepped[name])}...",
            )


def _grid_coordinates():
    from parallel.grid import destroy_distributed, init_distributed

    launch = init_distributed(30)
    grid = ProcessGrid(Layout(dp=2, tp=2, pp=2), launch.rank, launch.world_size)
    result = (
        grid.dp_rank,
        grid.pp_rank,
        grid.tp_rank,
        grid.dp_ranks,
        grid.pp_ranks,
        grid.tp_ranks,
    )
    destroy_distributed()
    return result


def test_process_grid_puts_tp_fastest():
    outcome = run_ranks(8, _grid_coordinates, timeout=60)
    for rank, (status, value) in outcome.items():
        assert status == "ok", outcome
        dp_rank, pp_rank, tp_rank, dp_ranks, pp_ranks, tp_ranks = value
        assert rank == (dp_rank * 2 + pp_rank) * 2 + tp_rank
        assert tp_ranks == [rank - tp_rank, rank - tp_rank + 1]  # a TP group is consecutive ranks
        assert dp_ranks == [pp_rank * 2 + tp_rank, 4 + pp_rank * 2 + tp_rank]
        assert pp_ranks == [dp_rank * 4 + tp_rank, dp_rank * 4 + 2 + tp_rank]


def test_layout_that_does_not_fit_the_world_is_named():
    with pytest.raises(ValueError, match=r"dp\*tp\*pp = 2\*3\*1 = 6 but WORLD_SIZE = 8"):
        check_layout(Layout(dp=2, tp=3), GPTConfig(n_head=6, n_embd=96), 12, 8, torch.float32)


@pytest.mark.integration
def test_a_dying_rank_stops_the_others_with_a_clear_error_then_resumes_exactly(corpus):
    clean = corpus / "dp2-clean"
    train_ranks(2, args(corpus, clean, "--dp", 2, "--batch_size", 4))
    out = corpus / "dp2-killed"
    outcome = run_ranks(
        2, train.main, args(corpus, out, "--dp", 2, "--batch_size", 4, "--inject", "crash@13"), timeout=90
    )
    assert outcome[1] == ("missing", -9)  # the last rank was SIGKILLed
    status, message = outcome[0]
    assert status == "exit" and "rank 1 stopped responding at step 13" in message, outcome  # its heartbeat
    assert "its process is gone" in message and "Run the same command again" in message
    train_ranks(2, args(corpus, out, "--dp", 2, "--batch_size", 4, "--inject", "crash@13"))
    assert_same_run(out, clean, exact=True)  # same layout: bitwise

    # the same dp=2 checkpoint continues on one process with the same global batch
    relayout = corpus / "dp2-to-dp1"
    outcome = run_ranks(
        2, train.main, args(corpus, relayout, "--dp", 2, "--batch_size", 4, "--inject", "crash@13"), timeout=90
    )
    assert outcome[1][0] == "missing"
    train.main(args(corpus, relayout, "--batch_size", 8))
    assert_same_run(relayout, clean)


def test_a_3d_run_killed_mid_way_resumes_on_other_layouts(corpus, single):
    """A dp2 x tp2 x pp2 run loses a rank at step 13; its single-device checkpoint of step 10 continues
    on one process and as tp2 x pp2, each with the losses of the uninterrupted run."""
    killed = corpus / "3d-killed"
    # fmt: off
    outcome = run_ranks(
        8,
        train.main,
        args(
            corpus,
            killed,
            "--dp", 2, "--tp", 2, "--pp", 2, "--batch_size", 4, "--micro_batches", 2, "--inject", "crash@13",
        ),
        timeout=120,
    )
    # fmt: on
    assert outcome[7] == ("missing", -9), outcome  # the last rank was SIGKILLed
    assert all(outcome[rank][0] == "exit" for rank in range(7)), outcome  # the others stop with an error
    shutil.copytree(killed, corpus / "3d-to-1x2x2")
    train.main(args(corpus, killed, "--batch_size", 8))
    assert_same_run(killed, single)
    train_ranks(
        4,
        args(corpus, corpus / "3d-to-1x2x2", "--dp", 1, "--tp", 2, "--pp", 2, "--batch_size", 8, "--micro_batches", 2),
    )
    assert_same_run(corpus / "3d-to-1x2x2", single)


def test_torchrun_end_to_end(corpus, single):
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    out = corpus / "torchrun"
    result = run_script(
        [*launcher, ROOT / "train.py", *args(corpus, out, "--dp", 2, "--batch_size", 4)], cwd=corpus, timeout=300
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[:3000]
    assert "ProcessGrid(rank 0/2: dp 0/2" in result.stdout and result.stdout.count("final check: val loss") == 1
    assert_same_run(out, single)


def test_spawned_ranks_take_the_same_steps(corpus, single):
    """The start method of macOS and Windows: fresh interpreters instead of forks of this one."""
    out = corpus / "dp2-spawn"
    outcome = run_ranks(
        2, train.main, args(corpus, out, "--dp", 2, "--batch_size", 4), timeout=180, start_method="spawn"
    )
    assert all(status == "ok" for status, _ in outcome.values()), outcome
    assert_same_run(out, single)


def test_a_pipeline_run_draws_its_gantt_chart_and_says_so(corpus, tmp_path, capfd):
    """A pipeline run's end draws the last step as its ranks ran it (pipeline.png), and the closing line lists it
    among the files the run wrote."""
    out = tmp_path / "pp2"
    train_ranks(2, args(corpus, out, "--pp", 2, "--micro_batches", 2, "--max_iters", 2, "--plot", "true"))
    assert (out / "pipeline.png").stat().st_size > 10_000, "the Gantt chart is drawn"
    printed = capfd.readouterr().out
    assert f"wrote {out}: metrics.jsonl, metrics.png, pipeline.png, samples.txt, ckpt/" in printed, printed[-1500:]


def test_mfu_counts_the_whole_model_under_tensor_parallelism(corpus):
    """Each TP rank holds 1/tp of the matrices, but the group trains the whole model: MFU counts all of it."""
    out = corpus / "tp2-mfu"
    train_ranks(2, args(corpus, out, "--dp", 1, "--tp", 2, "--batch_size", 8, "--max_iters", 5, "--peak_tflops", 1))
    whole = GPT(GPTConfig(block_size=32, vocab_size=256, n_layer=2, n_head=2, n_embd=32))  # MODEL's shape
    logged = [r for r in metrics(out) if "mfu" in r]
    assert len(logged) == 5
    for r in logged:  # tokens/s of the group x FLOPs per token of the whole model / (2 devices x 1 TFLOP/s)
        assert r["mfu"] == pytest.approx(
            closed_forms.flops_per_token(whole.config) * r["tokens_per_s"] / (2 * 1e12), rel=1e-12
        )


def _check_visibility(paths_by_rank):
    from machinery.job.cluster import check_visible_everywhere
    from parallel.grid import destroy_distributed, init_distributed

    launch = init_distributed(30)
    try:
        check_visible_everywhere(paths_by_rank[launch.rank])
    finally:
        destroy_distributed()


def test_a_rank_that_cannot_see_rank_0s_files_stops_every_rank(tmp_path):
    """Two machines without a shared file system: rank 0 wrote run.json, rank 1 (elsewhere) cannot see it."""
    written = tmp_path / "run.json"
    written.write_text("{}")
    outcome = run_ranks(
        2, _check_visibility, {0: [str(written)], 1: [str(tmp_path / "elsewhere" / "run.json")]}, timeout=60
    )
    for status, message in outcome.values():  # every rank stops, with the same advice
        assert status == "error" and "rank 1 cannot see" in message and "which rank 0 wrote" in message, outcome
        assert "a file system that every machine mounts" in message


def _train_with_a_late_rank(argv):
    """train.main, with rank 1 arriving 2 s late at the start: long after rank 0 saved step 0."""
    import os
    import time

    if os.environ["RANK"] == "1":
        set_up = train.set_up

        def late_set_up(*a, **kw):
            run = set_up(*a, **kw)
            time.sleep(2)
            return run

        train.set_up = late_set_up
    return train.main(argv)


def test_every_rank_resumes_from_the_checkpoint_rank_0_chose(corpus, single):
    """A late rank must not find step 0, written a moment ago, and resume while rank 0 starts afresh."""
    out = corpus / "dp2-late-rank"
    outcome = run_ranks(2, _train_with_a_late_rank, args(corpus, out, "--dp", 2, "--batch_size", 4), timeout=90)
    assert all(status == "ok" for status, _ in outcome.values()), outcome
    assert_same_run(out, single)


def test_zero_shares_out_the_state_as_the_closed_form_says(corpus):
    """state_bytes at the first update on dp2, of 16 B per parameter: plain DP keeps all 16, ZeRO-1 4 + 4 + 8/2
    (0.75 of it), ZeRO-2 4 + 12/2 (0.625), each equal to cost.py's closed form up to the padding that makes a
    bucket split into equal shards (under dp elements per bucket; one bucket here)."""
    measured = {}
    for zero in (0, 1, 2):
        out = corpus / f"state-zero{zero}"
        train_ranks(2, args(corpus, out, "--dp", 2, "--batch_size", 4, "--max_iters", 2, "--zero", zero))
        (measured[zero],) = [r["state_bytes"] for r in metrics(out) if "state_bytes" in r]
        _, _, configs = parse_args(args(corpus, out))
        closed_form = closed_forms.fullest_rank_state_bytes(configs.model, Layout(dp=2, zero=zero))
        assert closed_form <= measured[zero] < closed_form + 16 * 2, zero
    assert measured[1] / measured[0] == pytest.approx(0.75, abs=1e-4)
    assert measured[2] / measured[0] == pytest.approx(0.625, abs=1e-4)


@pytest.mark.integration
def test_a_zero2_run_killed_mid_way_resumes_on_one_process(corpus, single):
    """A dp2 ZeRO-2 run loses a rank at step 13: its checkpoint of step 10, in single-device form (the moments
    gathered whole from the ranks' shards), continues on one process and as dp2 ZeRO-1, each with the losses
    of the uninterrupted single process."""
    killed = corpus / "zero2-killed"
    outcome = run_ranks(
        2,
        train.main,
        args(corpus, killed, "--dp", 2, "--batch_size", 4, "--zero", 2, "--inject", "crash@13"),
        timeout=90,
    )
    assert outcome[1] == ("missing", -9), outcome
    shutil.copytree(killed, corpus / "zero2-to-zero1")
    train.main(args(corpus, killed, "--batch_size", 8))
    assert_same_run(killed, single)
    resumed = args(corpus, corpus / "zero2-to-zero1", "--dp", 2, "--batch_size", 4, "--zero", 1)
    train_ranks(2, resumed)
    assert_same_run(corpus / "zero2-to-zero1", single)
    # each rank took only its pieces of the checkpoint's moments, not views that keep them whole
    state = [r["state_bytes"] for r in metrics(corpus / "zero2-to-zero1") if "state_bytes" in r][-1]  # resumed
    closed_form = closed_forms.fullest_rank_state_bytes(parse_args(resumed)[2].model, Layout(dp=2, zero=1))
    assert closed_form <= state < closed_form + 16 * 2 * len(list(GPT(parse_args(resumed)[2].model).parameters()))


def check_flags(corpus, *flags):
    """layout.check_layout of the run these flags ask for, on as many processes as its layout needs."""
    configs = parse_args(args(corpus, corpus / "x", *flags))[2]
    layout = configs.parallel
    check_layout(layout, configs.model, configs.train.batch_size, layout.world_size, torch.float32)


def test_zero_is_refused_where_it_cannot_work(corpus):
    with pytest.raises(ValueError, match=r"--zero 1 shares the training state out over the data-parallel ranks"):
        check_flags(corpus, "--zero", 1)
    with pytest.raises(ValueError, match=r"--zero 3: choose 1 .* --dp_mode fsdp"):
        check_flags(corpus, "--dp", 2, "--zero", 3)
    with pytest.raises(ValueError, match=r"--zero 2 keeps only a shard .* pass --zero 1 with --pp"):
        check_flags(corpus, "--dp", 2, "--pp", 2, "--zero", 2)
    with pytest.raises(ValueError, match=r"leave out --dp_mode naive"):
        check_flags(corpus, "--dp", 2, "--zero", 2, "--dp_mode", "naive")
