"""Communication per dimension: what each rank counts in a training step equals the closed form, byte for byte."""

import pytest
import torch

import train
from conftest import run_ranks
from config import TrainConfig
from model import GPT, GPTConfig
from monitor import comm_bytes_per_step, parameters_on_rank
from parallel import ParallelConfig, ProcessGrid, destroy_distributed, init_distributed, take_comm_bytes

BATCH, ACCUMULATION, MICRO_BATCHES = 4, 2, 2


def _count_one_step(layout, model_kwargs, dtype, schedule):
    """On each rank: one optimizer step (2 micro-steps of accumulation) of the layout; the bytes it
    counted per dimension, the closed form for its stage, and the parameters it holds against theirs."""
    launch = init_distributed(30)
    dp, tp, pp = layout
    grid = ProcessGrid(dp, tp, pp, launch.rank, launch.world_size)
    mc = GPTConfig(**model_kwargs)
    torch.manual_seed(0)
    autocast = train.autocast_context(torch.device("cpu"), dtype)
    pcfg = ParallelConfig(dp, tp, pp, micro_batches=MICRO_BATCHES, schedule=schedule)
    model = train.model_for_rank(GPT(mc), grid, pcfg, autocast)
    cfg = TrainConfig(batch_size=BATCH, gradient_accumulation_steps=ACCUMULATION)
    optimizer = train.make_optimizer(model.module, cfg, model.device)
    generator = torch.Generator().manual_seed(grid.dp_rank)

    def next_batch():
        tokens = torch.randint(mc.vocab_size, (BATCH, mc.block_size + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    train.optimizer_step(model, optimizer, torch.amp.GradScaler("cpu", enabled=False), next_batch, 1e-3, cfg)
    counted = take_comm_bytes()
    formula = comm_bytes_per_step(mc, dp, tp, pp, grid.pp_rank, BATCH, ACCUMULATION,
                                  4 if dtype == torch.float32 else 2)
    held = sum(p.numel() for p in model.module.parameters())
    del model, optimizer
    destroy_distributed()
    return {"counted": counted, "formula": {d: b for d, (b, _) in formula.items()},
            "held": (held, parameters_on_rank(mc, tp, pp, grid.pp_rank)), "stage": grid.pp_rank}


SMALL = dict(block_size=8, vocab_size=101, n_layer=4, n_head=4, n_embd=32)  # V = 101: padded to a multiple of tp


@pytest.mark.parametrize("layout, model_kwargs, dtype, schedule", [
    ((2, 2, 2), SMALL, torch.float32, "1f1b"),
    ((1, 2, 4), dict(SMALL, bias=True, norm="layernorm"), torch.bfloat16, "gpipe"),  # inner stages talk both ways
    ((2, 4, 1), SMALL, torch.float32, "1f1b"),
], ids=["dp2xtp2xpp2-fp32", "tp2xpp4-bias-bf16", "dp2xtp4"])
def test_counted_bytes_equal_the_closed_form_on_every_rank(layout, model_kwargs, dtype, schedule):
    outcome = run_ranks(8, _count_one_step, layout, model_kwargs, dtype, schedule, timeout=120)
    assert all(status == "ok" for status, _ in outcome.values()), outcome
    for rank, (_, result) in outcome.items():
        assert result["counted"] == result["formula"], (rank, result)
        assert result["held"][0] == result["held"][1], (rank, result)
    # the shape of the story: TP talks at every layer, PP only at the stage borders, DP once per step
    counted = [result["counted"] for _, result in outcome.values()]
    assert all(c["tp"] > 0 for c in counted) and all((c["pp"] > 0) == (layout[2] > 1) for c in counted)
    assert all((c["dp"] > 0) == (layout[0] > 1) for c in counted)


def test_parameters_on_rank_add_up_to_the_model():
    """The stages of one TP rank hold the model once, plus the last stage's copy of the tied embedding."""
    for kwargs in (SMALL, dict(SMALL, bias=True, norm="layernorm"), dict(SMALL, norm_position="post")):
        mc = GPTConfig(**kwargs)
        whole = GPT(mc).num_params()
        assert parameters_on_rank(mc, 1, 1, 0) == whole
        assert sum(parameters_on_rank(mc, 1, 4, s) for s in range(4)) == whole + mc.vocab_size * mc.n_embd
