"""Megatron-style tensor parallelism with real gloo processes: every slice does the single-device math."""

import pytest
import torch

import checkpoint
import train
from local_ranks import run_ranks
from model import GPT, GPTConfig
from parallel import (ColumnParallelLinear, Cut, ProcessGrid, RowParallelLinear, ShardedModel, VocabParallelEmbedding,
                      check_tensor_parallel_layout, destroy_distributed, global_grad_norm, init_distributed)


def _compare_with_single_device(cfg_kwargs, tp):
    """On each rank: the TP model's logits, loss, grads (gathered) and clipped norm vs the single-device model."""
    launch = init_distributed(30)
    grid = ProcessGrid(1, tp, 1, launch.rank, launch.world_size)
    cfg = GPTConfig(**cfg_kwargs)
    torch.manual_seed(0)
    single = GPT(cfg)
    torch.manual_seed(0)
    model = ShardedModel(GPT(cfg), grid)
    sliced = model.module
    x = torch.randint(cfg.vocab_size, (3, cfg.block_size), generator=torch.Generator().manual_seed(1))
    y = torch.randint(cfg.vocab_size, (3, cfg.block_size), generator=torch.Generator().manual_seed(2))
    logits, loss = single(x, y)
    loss.backward()
    local_logits, tp_loss = sliced(x, y)
    tp_loss.backward()
    result = {"loss": (tp_loss.item(), loss.item())}
    # the logits: this rank's vocabulary slice
    V_local = local_logits.shape[-1]
    start = grid.tp_rank * V_local
    width = min(V_local, cfg.vocab_size - start)
    torch.testing.assert_close(local_logits[..., :width], logits[..., start : start + width])
    grads = dict(single.named_parameters())
    for name, p, cut in model.local_parameters():
        torch.testing.assert_close(checkpoint.gather_whole(p.grad, cut, grid), grads[name].grad, msg=name)
    full = checkpoint.full_state_dict(model, grid)
    assert list(full) == list(single.state_dict())
    for name, value in single.state_dict().items():
        torch.testing.assert_close(full[name], value, msg=name)
    norm = model.grad_norm()
    reference = global_grad_norm([], [p.grad for p in single.parameters()])
    train.clip_gradients(sliced.parameters(), norm, 0.5)
    train.clip_gradients(single.parameters(), reference, 0.5)
    for name, p, cut in model.local_parameters():  # clipped by the same factor as the single-device gradient
        torch.testing.assert_close(checkpoint.gather_whole(p.grad, cut, grid), grads[name].grad, msg=name)
    result["norm"] = (norm.item(), reference.item())
    # the sliced layers hold exactly 1/tp of the parameters
    counts = []
    for module_name, module in sliced.named_modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)) and module_name != "lm_head":
            counts.append((module.weight.numel(), dict(single.named_parameters())[f"{module_name}.weight"].numel()))
    result["counts"] = counts
    destroy_distributed()
    return result


@pytest.mark.parametrize(
    "tp, cfg",
    [
        (2, dict(block_size=16, vocab_size=256, n_layer=2, n_head=4, n_embd=32)),
        (4, dict(block_size=16, vocab_size=256, n_layer=2, n_head=4, n_embd=32)),
        (3, dict(block_size=16, vocab_size=256, n_layer=1, n_head=3, n_embd=24)),  # V padded to 258, masked
    ],
    ids=["tp2", "tp4", "tp3-padded-vocab"],
)
def test_tensor_parallel_equals_single_device(tp, cfg):
    outcome = run_ranks(tp, _compare_with_single_device, cfg, tp, timeout=120)
    for rank, (status, result) in outcome.items():
        assert status == "ok", outcome
        assert result["loss"][0] == pytest.approx(result["loss"][1], rel=1e-5)
        assert result["norm"][0] == pytest.approx(result["norm"][1], rel=1e-5)
        padding = (-cfg["vocab_size"]) % tp * cfg["n_embd"]  # the embedding's padding rows, if V % tp
        assert len(result["counts"]) == 4 * cfg["n_layer"] + 1
        for local, whole in result["counts"]:
            assert local * tp - whole in (0, padding)  # exactly 1/tp of each sliced matrix


def test_bad_layouts_are_named_before_any_process_group(tmp_path, capsys):
    with pytest.raises(ValueError, match="n_head 6 is not divisible by tp 4"):
        check_tensor_parallel_layout(GPTConfig(n_head=6, n_embd=96), 4)
    with pytest.raises(SystemExit) as exit_info:  # no launcher, no process group: it must not wait for peers
        train.main(["--tp", "8", "--out_dir", str(tmp_path / "o"), "--data_dir", str(tmp_path / "d")])
    assert "n_head 4 is not divisible by tp 8" in str(exit_info.value.code)


@pytest.mark.parametrize("cut", [Cut(dim=0), Cut(dim=1), Cut(dim=0, chunks=3), Cut(dim=0, rows=10)],
                         ids=["rows", "columns", "qkv-blocks", "padded-vocab"])
@pytest.mark.parametrize("tp", [2, 3, 4])
def test_cut_shard_then_unshard_is_the_identity(cut, tp):
    full = torch.randn(10 if cut.rows else 12 * tp, 6 * tp)
    shards = [cut.shard(full, tp, rank) for rank in range(tp)]
    assert len({s.shape for s in shards}) == 1  # equal slices: what all_gather needs
    assert torch.equal(cut.unshard(shards), full)
