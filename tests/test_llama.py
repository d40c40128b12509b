"""The llama arch (model.py, --arch llama): rotary positions, grouped-query attention, SwiGLU, q/k/v biases and an
untied head beside GPT-2's path; its parameter count in closed form; a run of it trained and resumed exactly. Its
data-parallel layouts against one process: tests/test_data_parallel.py."""

import contextlib
import io
import json

import pytest
import torch
from conftest import SHAKESPEARE, needs_gpt2, needs_shakespeare, save_bpe_tokenizer, write_word_corpus

import train
from machinery.components import checkpoint
from machinery.components.sample import KVCache, generate
from machinery.corpora.corpus import get_tokenizer
from machinery.interchange import hf_layouts, transfer
from machinery.job.arms import ArmedGPT, ArmsConfig
from machinery.job.files import file_sha256
from machinery.planning import closed_forms
from model import GPT, GPTConfig, apply_rope, padded_vocab_size, rope_angles
from parallel.grid import Layout, ProcessGrid
from parallel.layout import check_layout, model_for_rank

LLAMA = dict(arch="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=64, block_size=32)


def test_rotary_positions_make_scores_depend_on_distance_only():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(q_position, k_position):
        turned_q = apply_rope(q, *rope_angles(16, torch.tensor([q_position]), 10000.0))
        turned_k = apply_rope(k, *rope_angles(16, torch.tensor([k_position]), 10000.0))
        return (turned_q * turned_k).sum().item()

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-5)  # the same distance, 4
    assert score(7, 3) != pytest.approx(score(9, 3), abs=1e-3)
    assert torch.equal(apply_rope(q, *rope_angles(16, torch.tensor([0]), 10000.0)), q)  # position 0 turns nothing


def test_grouped_query_attention_keeps_fewer_keys_and_values():
    model = GPT(GPTConfig(**LLAMA))
    assert model.wpe is None and model.blocks[0].attn.c_attn.out_features == 64 + 2 * 32  # q 64, k and v 32 each
    cache = [KVCache() for _ in model.blocks]
    model(torch.randint(0, 256, (2, 5)), cache=cache)
    assert cache[0].k.shape == (2, 2, 5, 16)  # two key/value heads kept, not four


@pytest.mark.parametrize("n_kv_head", [1, 2, 4])
def test_the_kv_cache_gives_the_tokens_of_the_whole_context(n_kv_head):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**LLAMA, "n_kv_head": n_kv_head})).eval()
    prompt = torch.randint(0, 256, (2, 4))
    with_cache = generate(model, prompt, 40, temperature=0, kv_cache=True)  # past block_size 32: cropped
    without = generate(model, prompt, 40, temperature=0, kv_cache=False)
    assert torch.equal(with_cache, without)
    cache = [KVCache() for _ in model.blocks]
    full, _ = model(with_cache[:, :12])
    model(with_cache[:, :11], cache=cache)
    last, _ = model(with_cache[:, 11:12], cache=cache)  # position 11 turned by its own angle, past the prompt
    torch.testing.assert_close(last[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "extra",
    [{}, {"qkv_bias": True}, {"tie_embeddings": False}, {"n_kv_head": 1, "mlp_hidden": 100}, {"bias": True}],
)
def test_the_closed_form_counts_the_llama_parameters(extra):
    gpt_config = GPTConfig(**{**LLAMA, **extra})
    assert closed_forms.parameters_on_rank(gpt_config) == GPT(gpt_config).num_params()
    assert GPTConfig(**LLAMA).hidden == 192  # 8 C / 3 = 170.7, up to a multiple of 64


@pytest.mark.parametrize(
    "fields", [{}, {"arch": "llama"}, {"arch": "llama", "n_kv_head": 1, "mlp_hidden": 512}], ids=["gpt", "llama", "gqa"]
)
def test_the_planners_activations_per_block_match_what_autograd_keeps(fields):
    """closed_forms.memory_per_gpu's bytes per block (SwiGLU's four hidden tensors, RoPE's rotated q and k, GQA's
    smaller k and v) against the saved tensors of one more block, within the 25% notebook 09 allows GPT's."""
    from machinery.health.monitor import SavedActivations

    def kept(n_layer):
        gpt_config = GPTConfig(n_layer=n_layer, n_head=4, n_embd=128, block_size=64, vocab_size=256, **fields)
        torch.manual_seed(0)
        model, tokens = GPT(gpt_config), torch.randint(256, (8, 64))
        with SavedActivations(model) as saved:
            model(tokens, tokens)[1].backward()
        planned = closed_forms.memory_per_gpu(
            gpt_config, Layout(), 8, 1, activation_bytes=4
        ).activations  # fp32, as measured
        return saved.peak, planned

    (measured_2, planned_2), (measured_3, planned_3) = kept(2), kept(3)
    assert (measured_3 - measured_2) / (planned_3 - planned_2) == pytest.approx(1, abs=0.25)


def test_an_untied_head_is_a_matrix_of_its_own_in_checkpoints_too():
    tied = GPT(GPTConfig(**LLAMA))
    assert tied.lm_head.weight is tied.wte.weight
    model = GPT(GPTConfig(**LLAMA, tie_embeddings=False))
    assert model.lm_head.weight is not model.wte.weight
    grid = ProcessGrid()
    full = checkpoint.full_state_dict(model_for_rank(model, grid, Layout(), 1))
    assert torch.equal(full["lm_head.weight"], model.lm_head.weight) and torch.equal(
        full["wte.weight"], model.wte.weight
    )
    assert not torch.equal(full["lm_head.weight"], full["wte.weight"])


def test_wrong_llama_settings_are_named():
    with pytest.raises(ValueError, match="n_kv_head 3 must divide n_head 4"):
        GPTConfig(**{**LLAMA, "n_kv_head": 3})
    with pytest.raises(ValueError, match="pass --arch llama"):
        GPTConfig(n_head=4, n_kv_head=2)
    with pytest.raises(ValueError, match="n_kv_head 2 is not divisible by tp 4"):
        check_layout(Layout(dp=1, tp=4), GPTConfig(**LLAMA), 8, 4, torch.float32)


@pytest.mark.parametrize("data", ["source", "mix"])
def test_a_llama_run_learns_and_resumes_exactly(tmp_path, data):
    write_word_corpus(tmp_path / "corpus.txt", 2000)
    if data == "mix":  # two sources, their weights turned around mid-run, across the resume
        (tmp_path / "numbers.txt").write_text("".join(f"{i} {i + 1} {i + 2}.\n" for i in range(3000)))
        sources = {"words": str(tmp_path / "corpus.txt"), "numbers": str(tmp_path / "numbers.txt")}
        schedule = [{"step": 15, "weights": {"words": 1, "numbers": 3}, "ramp": 10}]
        mix = {"sources": sources, "weights": {"words": 3, "numbers": 1}, "schedule": schedule}
        (tmp_path / "mix.json").write_text(json.dumps(mix))
    reads = ["--source", tmp_path / "corpus.txt"] if data == "source" else ["--mix", tmp_path / "mix.json"]
    # fmt: off
    common = [
        *reads, "--data_dir", tmp_path / "data", "--arch", "llama", "--n_kv_head", 1,
        "--n_layer", 2, "--n_head", 2, "--n_embd", 32, "--block_size", 32, "--batch_size", 8, "--dtype", "float32",
        "--warmup_iters", 5, "--lr_decay_iters", 40, "--log_interval", 1, "--eval_interval", 20, "--eval_iters", 2,
        "--ckpt_interval", 20, "--num_samples", 0,
    ]
    # fmt: on
    train.main([str(a) for a in [*common, "--out_dir", tmp_path / "whole", "--max_iters", 40]])
    train.main([str(a) for a in [*common, "--out_dir", tmp_path / "halves", "--max_iters", 20]])
    train.main([str(a) for a in [*common, "--out_dir", tmp_path / "halves", "--max_iters", 40]])  # continued

    def losses(out):
        return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").open()) if "loss" in r}

    whole, halves = losses(tmp_path / "whole"), losses(tmp_path / "halves")
    assert whole == halves  # bit for bit, the second half resumed from the checkpoint of step 20
    # a word corpus the model learns within tens of steps; the numbers' digits it learns slower
    assert whole[39] < (0.6 if data == "source" else 0.75) * whole[0]


# ----------------------------------------------------------------------------
# Llama's weights in and out of transformers (tests only: the project reads and writes them with its own code)


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    """A random LlamaForCausalLM (2 layers, 4 heads, 2 key/value heads, width 64, bytes' 256 ids, an untied head)
    saved by transformers, and the model itself."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=5e5,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("hf-llama")
    model.save_pretrained(folder)
    return folder, model


def test_a_hf_llama_folder_needs_no_model_flags_and_samples_its_greedy_tokens(hf_llama, tmp_path):
    folder, hf = hf_llama
    out = tmp_path / "from-llama"
    # fmt: off
    common = ["--out_dir", out, "--dtype", "float32", "--batch_size", 4, "--eval_iters", 2, "--num_samples", 0]
    train.main([str(a) for a in ["--init_from", folder, "--max_iters", 0, *common]])
    # fmt: on
    run = json.loads((out / "run.json").read_text())["GPTConfig"]
    assert (run["arch"], run["n_kv_head"], run["mlp_hidden"], run["rope_theta"]) == ("llama", 2, 160, 5e5)
    assert (run["rms_norm_eps"], run["tie_embeddings"], run["block_size"]) == (1e-5, False, 64)
    prompt = "def "
    expected = hf.generate(torch.tensor([list(prompt.encode())]), max_new_tokens=16, do_sample=False)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        train.main(["--sample", "--out_dir", str(out), "--prompt", prompt, "--top_k", "1", "--max_new_tokens", "16",
                    "--num_samples", "1"])  # fmt: skip
    text = bytes(expected[0].tolist()).decode("utf-8", errors="replace")
    assert text in printed.getvalue()


def test_a_model_flag_that_contradicts_the_folder_is_refused(hf_llama, tmp_path):
    folder, _ = hf_llama
    with pytest.raises(SystemExit, match="--n_kv_head 4 contradicts --init_from .*n_kv_head 2"):
        train.main(["--init_from", str(folder), "--n_kv_head", "4", "--out_dir", str(tmp_path / "o")])


def test_the_weights_read_give_transformers_logits(hf_llama):
    folder, hf = hf_llama
    source = transfer.initial_weights(str(folder))
    ours = GPT(source.gpt_config).eval()
    ours.load_state_dict(source.state_dict)
    tokens = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens)[0], hf(tokens).logits, rtol=0, atol=1e-4)


@needs_gpt2
@pytest.mark.parametrize("tied", [True, False])
def test_export_hf_of_a_llama_run_loads_in_transformers(tmp_path, tied):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt_config = GPTConfig(**{**LLAMA, "vocab_size": 50304, "tie_embeddings": tied, "rms_norm_eps": 1e-5})
    ours = GPT(gpt_config).eval()
    transfer.export_hf(ours.state_dict(), gpt_config, "gpt2", str(tmp_path / "hf"))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    tokens = torch.randint(0, 50257, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens)[0][..., :50257], rtol=0, atol=1e-4)


def test_a_base_brings_its_tokenizer_and_the_export_carries_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    corpus = write_word_corpus(tmp_path / "corpus.txt", 400)
    base = save_bpe_tokenizer(tmp_path / "base", [corpus.read_text()] * 3)
    vocab_size = get_tokenizer(str(base)).vocab_size
    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=True,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(base)
    out = tmp_path / "continued"
    # fmt: off
    train.main([str(a) for a in [
        "--init_from", base, "--source", corpus, "--data_dir", tmp_path / "data", "--out_dir", out, "--max_iters", 2,
        "--batch_size", 4, "--eval_iters", 1, "--dtype", "float32", "--num_samples", 0,
    ]])
    # fmt: on
    assert json.loads((tmp_path / "data" / "meta.json").read_text())["tokenizer"] == str(base)  # the base's ids
    transfer.export_run(str(out), str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "alpha beta gamma."
    assert exported.encode(text, add_special_tokens=False) == get_tokenizer(str(base)).encode(text)


def test_a_named_llama_base_brings_its_config_and_tokenizer(tmp_path, monkeypatch):
    """--init_from NAME of a Llama base (as SmolLM2-135M): its three files fetched from the hub before the data, the
    architecture from the code's record of its config.json, the corpus tokenized with its tokenizer.json, and the
    step-0 evaluation showing the loss its weights bring."""
    from test_transfer import serve_from_a_local_hub

    transformers = pytest.importorskip("transformers")
    corpus = write_word_corpus(tmp_path / "corpus.txt", 400)
    made = save_bpe_tokenizer(tmp_path / "made", [corpus.read_text()] * 3)
    fields = dict(
        vocab_size=get_tokenizer(str(made)).vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).save_pretrained(made)
    names = ("config.json", "tokenizer.json", "model.safetensors")
    served = serve_from_a_local_hub(monkeypatch, tmp_path, "someone/llama", "abc123",
                                    {name: (made / name).read_bytes() for name in names})  # fmt: skip
    pinned = {name: file_sha256(served / name) for name in names}
    base = transfer.NamedBase("someone/llama", "abc123", pinned, hf_layouts.llama_config_from_hf(fields))
    monkeypatch.setitem(transfer.NAMED_BASES, "tiny-llama", base)
    out = tmp_path / "continued"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        # fmt: off
        train.main([str(a) for a in [
            "--init_from", "tiny-llama", "--source", corpus, "--data_dir", tmp_path / "data", "--out_dir", out,
            "--max_iters", 2, "--batch_size", 4, "--eval_iters", 1, "--dtype", "float32", "--num_samples", 0,
        ]])
        # fmt: on
    folder = tmp_path / "weights" / "tiny-llama"
    assert json.loads((tmp_path / "data" / "meta.json").read_text())["tokenizer"] == str(folder)  # the base's ids
    run = json.loads((out / "run.json").read_text())["GPTConfig"]
    assert (run["arch"], run["n_kv_head"], run["mlp_hidden"], run["block_size"]) == ("llama", 1, 64, 32)
    assert "starting from the weights of tiny-llama (at abc123)" in printed.getvalue()
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and "val_loss" in first
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert transfer.fetch_named_base("tiny-llama") == str(folder)
    assert printed.getvalue() == ""  # fetched once: the next start reads the folder


@pytest.fixture(scope="module")
def longer_base(tmp_path_factory):
    """A random LlamaForCausalLM with GPT-2's 50257 ids and 128 positions, more than the runs below take, and an
    untied head, as a user's base often is; prepared once with its Shakespeare token files, so ranks never race."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=50257, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip
    root = tmp_path_factory.mktemp("longer-base")
    transformers.LlamaForCausalLM(config).save_pretrained(root / "base")
    return root


def on_a_shorter_block(root, out, *extra):
    """The flags of a run from the longer base on 64 positions: no model flag but --block_size."""
    # fmt: off
    return [str(a) for a in [
        "--init_from", root / "base", "--tokenizer", "gpt2", "--source", SHAKESPEARE, "--data_dir", root / "data",
        "--out_dir", out, "--block_size", 64, "--max_iters", 12, "--dtype", "float32", "--learning_rate", 3e-3,
        "--log_interval", 1, "--eval_interval", 6, "--eval_iters", 2, "--num_samples", 0, "--dist_timeout", 60,
        *extra,
    ]]
    # fmt: on


@needs_gpt2
@needs_shakespeare
def test_a_llama_base_with_more_positions_trains_samples_and_exports_on_a_shorter_block(longer_base):
    """A base of 128 rotary positions on a block of 64: no table to crop, so its tensors load as they are. It trains
    12 steps, its greedy text is transformers' (with the KV cache and without), and its export reloads."""
    transformers = pytest.importorskip("transformers")
    out = longer_base / "single"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        train.main(on_a_shorter_block(longer_base, out, "--batch_size", 4))
    assert "holds 128 positions; this run's block_size is 64: its rotary positions need no table" in printed.getvalue()
    run = json.loads((out / "run.json").read_text())["GPTConfig"]
    assert (run["arch"], run["block_size"], run["n_kv_head"], run["tie_embeddings"]) == ("llama", 64, 2, False)
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()][-1] == 12
    train.main(["--export_hf", str(longer_base / "export"), "--out_dir", str(out)])
    theirs = transformers.AutoModelForCausalLM.from_pretrained(longer_base / "export").eval()
    _, state = checkpoint.load_latest(out / "ckpt")
    ours = ArmedGPT(ArmsConfig(**{**run, "vocab_size": 50257})).eval()  # run.json records the model with its arms
    ours.load_state_dict(state["model"])
    tokens = torch.randint(0, 50257, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens)[0], rtol=0, atol=1e-4)
    tokenizer = get_tokenizer("gpt2")
    prompt = "ROMEO:"
    expected = theirs.generate(torch.tensor([tokenizer.encode(prompt)]), max_new_tokens=12, do_sample=False)
    for kv_cache in ("true", "false"):
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            train.main(["--sample", "--out_dir", str(out), "--prompt", prompt, "--top_k", "1", "--max_new_tokens",
                        "12", "--num_samples", "1", "--kv_cache", kv_cache])  # fmt: skip
        assert tokenizer.decode(expected[0].tolist()) in printed.getvalue(), kv_cache


@needs_gpt2
@needs_shakespeare
@pytest.mark.integration
@pytest.mark.parametrize(
    "world_size, layout",
    [(4, ["--batch_size", 2, "--dp", 2, "--tp", 2]), (2, ["--batch_size", 4, "--dp", 1, "--pp", 2])],
    ids=["dp2xtp2", "pp2"],
)
def test_the_shorter_block_takes_the_single_process_steps_on_other_layouts(longer_base, world_size, layout):
    """The same base and block on dp2 x tp2 (the base's 50257 vocabulary rows cut by TP) and pp2."""
    from test_data_parallel import assert_same_run, train_ranks

    single = longer_base / "reference"
    if not (single / "run.json").exists():
        train.main(on_a_shorter_block(longer_base, single, "--batch_size", 4))
    out = longer_base / "-".join(map(str, layout))
    train_ranks(world_size, on_a_shorter_block(longer_base, out, *layout), timeout=300)
    assert_same_run(out, single)


def test_sharded_safetensors_are_read_and_written(hf_llama, tmp_path):
    transformers = pytest.importorskip("transformers")
    _, hf = hf_llama
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")  # its index and several files
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    source = transfer.initial_weights(str(tmp_path / "sharded"))
    ours = GPT(source.gpt_config).eval()
    ours.load_state_dict(source.state_dict)
    tokens = torch.randint(0, 256, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens)[0], hf(tokens).logits, rtol=0, atol=1e-4)
    # our export past the size limit: numbered shards and an index, which transformers loads
    tokenizer = save_bpe_tokenizer(tmp_path / "tokenizer", ["the quick brown fox jumps over the lazy dog"] * 5)
    vocab_size = get_tokenizer(str(tokenizer)).vocab_size
    gpt_config = GPTConfig(**{**LLAMA, "vocab_size": padded_vocab_size(vocab_size)})
    ours = GPT(gpt_config).eval()
    export = tmp_path / "export"
    transfer.export_hf(ours.state_dict(), gpt_config, str(tokenizer), str(export), 50_000)
    assert len(list(export.glob("model-*.safetensors"))) > 1 and (export / "model.safetensors.index.json").is_file()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(export).eval()
    tokens = torch.randint(0, vocab_size, (1, 30))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours(tokens)[0][..., :vocab_size], rtol=0, atol=1e-4)
    # exported again in one file: the shards of the first export go, a file of the user's stays
    (export / "notes.txt").write_text("mine")
    transfer.export_hf(ours.state_dict(), gpt_config, str(tokenizer), str(export))
    assert not list(export.glob("model-*.safetensors")) and not (export / "model.safetensors.index.json").exists()
    assert (export / "model.safetensors").is_file() and (export / "notes.txt").read_text() == "mine"
