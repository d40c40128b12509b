"""transfer.py: our safetensors against the package, GPT-2's weights in from Hugging Face and out to it with the
same logits, and the refusals (shapes, architecture, tokenizer, a foreign folder, a download with the wrong sha256).
transformers and safetensors are test-only: their tests skip without them."""

import json
from dataclasses import asdict, replace

import pytest
import tiktoken
import torch
from conftest import needs_gpt2

import train
from machinery.components import checkpoint
from machinery.interchange import hf_layouts, safetensors_format, transfer
from machinery.job import config
from machinery.job.arms import ArmsConfig
from machinery.job.files import file_sha256
from model import GPT, GPTConfig

GPT2_SHAPED = dict(norm="layernorm", bias=True, activation="gelu_tanh")


def small_model(**fields):
    gpt_config = GPTConfig(**dict(n_layer=2, n_head=4, n_embd=64, vocab_size=256, block_size=32) | fields)
    torch.manual_seed(0)
    return GPT(gpt_config), gpt_config


def sample_tensors():
    torch.manual_seed(0)
    return {
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "f32": torch.randn(4, 2, 3),
        "f16": torch.randn(7).half(),
        "i64": torch.tensor([[1, -2], [2**40, 3]]),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "transposed": torch.randn(3, 4).t(),  # not contiguous: written as its values
    }


def test_safetensors_we_write_the_package_reads(tmp_path):
    safetensors = pytest.importorskip("safetensors", reason="the safetensors package is the reference (test-only)")
    path, tensors = tmp_path / "ours.safetensors", sample_tensors()
    safetensors_format.write_safetensors(str(path), tensors, metadata={"format": "pt", "note": "ours"})
    with safetensors.safe_open(str(path), "pt") as f:
        assert f.metadata() == {"format": "pt", "note": "ours"}
        loaded = {name: f.get_tensor(name) for name in f.keys()}
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    header_size = int.from_bytes(path.read_bytes()[:8], "little")
    assert header_size % 8 == 0  # padded, as the reference pads it


def test_safetensors_the_package_writes_we_read(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch", reason="the safetensors package is the reference")
    path, tensors = tmp_path / "theirs.safetensors", sample_tensors()
    safetensors_torch.save_file({k: t.contiguous() for k, t in tensors.items()}, str(path), metadata={"a": "b"})
    loaded = safetensors_format.read_safetensors(str(path))
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


def test_a_malformed_safetensors_file_is_named_with_its_problem(tmp_path):
    path = tmp_path / "w.safetensors"
    safetensors_format.write_safetensors(str(path), {"w": torch.ones(4)})
    whole = path.read_bytes()
    path.write_bytes(whole[:-4])  # the last float cut off
    with pytest.raises(ValueError, match=r"w\.safetensors is not a valid safetensors file: tensor w .*16 bytes"):
        safetensors_format.read_safetensors(str(path))
    path.write_bytes(whole.replace(b'"F32"', b'"F99"'))
    with pytest.raises(ValueError, match=r"tensor w has dtype 'F99'; this reader knows F64, F32"):
        safetensors_format.read_safetensors(str(path))
    path.write_bytes(b"\x00" * 5)
    with pytest.raises(ValueError, match="shorter than the 8-byte header length"):
        safetensors_format.read_safetensors(str(path))


def test_older_gpt2_layouts_load_in_fp32():
    """The Hub's own GPT-2 files name tensors without "transformer.", keep the causal-mask buffers
    (h.{i}.attn.bias, attn.masked_bias) and sometimes the tied head; some hold fp16."""
    model, _ = small_model(**GPT2_SHAPED)
    hf = {
        name.removeprefix("transformer."): t.half()
        for name, t in hf_layouts.state_dict_to_hf(model.state_dict(), 256).items()
    }
    hf |= {
        "h.0.attn.bias": torch.ones(1, 1, 32, 32),
        "h.1.attn.masked_bias": torch.tensor(-1e4),
        "lm_head.weight": hf["wte.weight"],
    }
    state_dict = hf_layouts.state_dict_from_hf(hf)
    assert state_dict.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert state_dict[name].dtype == torch.float32
        torch.testing.assert_close(state_dict[name], tensor.half().float(), rtol=0, atol=0)
    assert state_dict["lm_head.weight"] is state_dict["wte.weight"]
    with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight: an untied head"):
        hf_layouts.state_dict_from_hf({**hf, "lm_head.weight": torch.zeros_like(hf["wte.weight"])})
    del hf["h.1.mlp.c_fc.bias"]
    with pytest.raises(ValueError, match=r"no tensor h\.1\.mlp\.c_fc\.bias \(or transformer\.h\.1\.mlp\.c_fc\.bias\)"):
        hf_layouts.state_dict_from_hf(hf)


def random_hf_gpt2(transformers):
    """A small GPT2LMHeadModel with GPT-2's vocabulary, every weight and bias away from its init."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=50257)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # wte once: lm_head is the same tensor
            p.add_(0.05 * torch.randn_like(p))
    return model


@needs_gpt2
def test_gpt2_weights_come_in_and_go_out_with_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers is the reference GPT-2 (test-only)")
    hf = random_hf_gpt2(transformers)
    hf.save_pretrained(tmp_path / "hf")
    gpt_config, state_dict, tokenizer, _, _ = transfer.initial_weights(str(tmp_path / "hf"))
    assert tokenizer == "gpt2"
    assert gpt_config == GPTConfig(
        block_size=128, vocab_size=50257, n_layer=2, n_head=4, n_embd=64, **hf_layouts.GPT2_ARCHITECTURE
    )
    ours = GPT(gpt_config).eval()
    ours.load_state_dict(state_dict)
    idx = torch.randint(0, 50257, (3, 20), generator=torch.Generator().manual_seed(1))  # (B, T)
    with torch.no_grad():
        our_logits, _ = ours(idx)  # (B, T, V)
        torch.testing.assert_close(our_logits, hf(idx).logits, atol=1e-4, rtol=0)

    # Out again, as a run holds it: the vocabulary padded to 50304 rows, which the export trims.
    wte = state_dict["wte.weight"]
    padded_wte = torch.cat([wte, torch.randn(50304 - 50257, wte.shape[1])])
    padded = {**state_dict, "wte.weight": padded_wte, "lm_head.weight": padded_wte}
    dest = tmp_path / "export"
    for _ in range(2):  # the second export replaces the first
        transfer.export_hf(padded, replace(gpt_config, vocab_size=50304), "gpt2", str(dest))
    assert not (tmp_path / "export.tmp").exists() and not (tmp_path / "export.old").exists()
    exported = transformers.AutoModelForCausalLM.from_pretrained(dest).eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(idx).logits, our_logits, atol=1e-4, rtol=0)
    text = "Hello world\n\n  It's 2024: naïve café,\tünïcödé 🙂 and   spaces."  # (HF reads <|endoftext|> as special)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(dest)
    assert hf_tokenizer.encode(text) == tiktoken.get_encoding("gpt2").encode_ordinary(text)
    assert hf_tokenizer.encode("Hello world") == tiktoken.get_encoding("gpt2").encode("Hello world")
    assert hf_tokenizer.eos_token_id == 50256


def test_fit_to_run_refuses_another_shape_naming_both():
    source, source_gpt_config = small_model()
    run_gpt_config = replace(source_gpt_config, n_layer=1, n_embd=32)
    with pytest.raises(
        ValueError,
        match=r"--init_from out/a holds n_layer 2, n_embd 64; this run has n_layer 1, n_embd 32: "
        r"pass --n_layer 2 --n_embd 64",
    ):
        transfer.fit_to_run(source_gpt_config, source.state_dict(), run_gpt_config, "out/a")
    with pytest.raises(
        ValueError,
        match=r"holds norm rmsnorm, bias False, activation gelu; this run has norm layernorm, bias True, "
        r"activation gelu_tanh: pass --norm rmsnorm --bias false --activation gelu$",
    ):
        transfer.fit_to_run(source_gpt_config, source.state_dict(), replace(source_gpt_config, **GPT2_SHAPED), "out/a")
    with pytest.raises(ValueError, match=r"holds block_size 32; this run has block_size 64: pass --block_size 32"):
        transfer.fit_to_run(source_gpt_config, source.state_dict(), replace(source_gpt_config, block_size=64), "out/a")
    with pytest.raises(ValueError, match=r"holds 256 token rows; this run's tokenizer pads to 50304"):
        transfer.fit_to_run(
            source_gpt_config, source.state_dict(), replace(source_gpt_config, vocab_size=50304), "out/a"
        )
    wrong = {**source.state_dict(), "blocks.1.mlp.c_fc.weight": torch.zeros(128, 64)}
    with pytest.raises(
        ValueError, match=r"blocks\.1\.mlp\.c_fc\.weight is \(128, 64\); this run's model needs \(256, 64\)"
    ):
        transfer.fit_to_run(source_gpt_config, wrong, source_gpt_config, "out/a")


LLAMA_SHAPED = dict(arch="llama", n_kv_head=2, tie_embeddings=False)


@pytest.mark.parametrize("fields", [GPT2_SHAPED, LLAMA_SHAPED], ids=["gpt2", "llama"])
def test_fit_to_run_takes_a_shorter_or_equal_block_and_refuses_a_longer_one(fields, capsys):
    """Every block_size path of both architectures: shorter (GPT-2's position table cropped, Llama's rotary
    positions left as they are), the same (the tensors as they came), longer (refused by name). Each fitted model
    gives the source's logits on the positions both hold."""
    source, source_gpt_config = small_model(**fields)  # block_size 32
    source.eval()
    idx = torch.randint(0, 256, (2, 32))
    for block_size, message in [(16, "holds 32 positions; this run's block_size is 16"), (32, None)]:
        run_gpt_config = replace(source_gpt_config, block_size=block_size)
        gpt_config, state_dict = transfer.fit_to_run(source_gpt_config, source.state_dict(), run_gpt_config, "x")
        said = capsys.readouterr().out.splitlines()
        assert gpt_config == run_gpt_config
        assert (message in said[0]) if message else said == []
        model = GPT(gpt_config).eval()
        model.load_state_dict(state_dict)
        with torch.no_grad():
            torch.testing.assert_close(model(idx[:, :block_size])[0], source(idx[:, :block_size])[0])
    with pytest.raises(ValueError, match=r"holds block_size 32; this run has block_size 48: pass --block_size 32"):
        transfer.fit_to_run(source_gpt_config, source.state_dict(), replace(source_gpt_config, block_size=48), "x")


def test_fit_to_run_keeps_the_source_vocabulary():
    source, source_gpt_config = small_model(vocab_size=250, **GPT2_SHAPED)  # unpadded, as HF's 50257; both pad to 256
    source.eval()
    run_gpt_config = replace(source_gpt_config, vocab_size=256, block_size=16)
    gpt_config, state_dict = transfer.fit_to_run(source_gpt_config, source.state_dict(), run_gpt_config, "x")
    assert gpt_config == replace(run_gpt_config, vocab_size=250)
    model = GPT(gpt_config).eval()
    model.load_state_dict(state_dict)
    idx = torch.randint(0, 250, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], source(idx)[0])
    # a model already built with the source's rows (a resumed run, from run.json's record) fits them as they are
    fitted, _ = transfer.fit_to_run(
        source_gpt_config, source.state_dict(), replace(run_gpt_config, vocab_size=250), "x"
    )
    assert fitted == gpt_config


def test_a_bare_safetensors_file_is_compared_by_its_tensors(tmp_path, capsys):
    source, source_gpt_config = small_model(**GPT2_SHAPED)
    path = tmp_path / "w.safetensors"
    safetensors_format.write_safetensors(str(path), hf_layouts.state_dict_to_hf(source.state_dict(), 256))
    gpt_config, state_dict, tokenizer, description, data = transfer.initial_weights(str(path))
    assert (gpt_config, tokenizer, description, data) == (None, None, str(path), None)
    fitted, _ = transfer.fit_to_run(gpt_config, state_dict, source_gpt_config, description)
    said = capsys.readouterr().out.splitlines()
    assert fitted == source_gpt_config and "read from its tensors" in said[0]
    with pytest.raises(ValueError, match=r"holds n_layer 2; this run has n_layer 3: pass --n_layer 2"):
        transfer.fit_to_run(gpt_config, state_dict, replace(source_gpt_config, n_layer=3), description)
    rmsnorm = replace(source_gpt_config, norm="rmsnorm", bias=False)
    with pytest.raises(ValueError, match=r"holds tensors this run's model has none of \(blocks\.0\.attn\.c_attn\.bias"):
        transfer.fit_to_run(gpt_config, state_dict, rmsnorm, description)


def test_export_refuses_another_architecture_or_tokenizer(tmp_path):
    model, gpt_config = small_model()
    dest = tmp_path / "hf"
    with pytest.raises(
        ValueError,
        match=r"--export_hf writes GPT-2's architecture; this run has norm: 'rmsnorm' \(GPT-2: 'layernorm'\), "
        r"bias: False \(GPT-2: True\), activation: 'gelu' \(GPT-2: 'gelu_tanh'\): train with --preset gpt2-small or "
        r"--norm layernorm --bias true --activation gelu_tanh",
    ):
        transfer.export_hf(model.state_dict(), gpt_config, "gpt2", str(dest))
    model, gpt_config = small_model(**GPT2_SHAPED)
    with pytest.raises(ValueError, match=r"needs GPT-2's tokenizer.*this run's tokenizer is 'byte'"):
        transfer.export_hf(model.state_dict(), gpt_config, "byte", str(dest))
    assert not dest.exists()


@needs_gpt2
def test_export_refuses_a_foreign_folder_and_leaves_it_untouched(tmp_path):
    model, gpt_config = small_model(**GPT2_SHAPED)
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    (dest / "config.json").write_text(json.dumps({"model_type": "gpt2"}))  # a GPT-2, but not an export of ours
    with pytest.raises(ValueError, match=r"--export_hf .*mine exists and is not an earlier export of ours"):
        transfer.export_hf(model.state_dict(), gpt_config, "gpt2", str(dest))
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "notes.txt"]
    assert (dest / "notes.txt").read_text() == "keep me"


@needs_gpt2
def test_export_run_takes_the_newest_checkpoint_and_says_how_to_score_it(tmp_path, capsys):
    out_dir, dest = tmp_path / "run", tmp_path / "hf"
    model, gpt_config = small_model(vocab_size=50304, **GPT2_SHAPED)  # padded, as a run's
    identity = {"GPTConfig": asdict(gpt_config)}  # a checkpoint records it as run.json does, a dict
    state = {"model": model.state_dict(), "config": identity, "meta": {"tokenizer": "gpt2"}}
    checkpoint.save(str(out_dir / "ckpt"), 200, state, healthy=True)
    transfer.export_run(str(out_dir), str(dest))
    said = capsys.readouterr().out.splitlines()
    assert "its checkpoint of step 200" in said[0]
    assert (
        said[-1]
        == f"score it on HellaSwag: lm_eval --model hf --model_args pretrained={dest} --tasks hellaswag --device cpu"
    )
    written = safetensors_format.read_safetensors(str(dest / "model.safetensors"))
    assert written["transformer.wte.weight"].shape == (50257, 64)
    torch.testing.assert_close(written["transformer.wte.weight"], model.wte.weight[:50257].detach())
    hf_config = json.loads((dest / "config.json").read_text())
    assert (hf_config["vocab_size"], hf_config["eos_token_id"], hf_config["n_positions"]) == (50257, 50256, 32)
    with pytest.raises(ValueError, match=r"--export_hf: no checkpoint in .*empty.*ckpt: train first"):
        transfer.export_run(str(tmp_path / "empty"), str(tmp_path / "hf2"))


EXPORT_FILES = [
    "config.json",
    "merges.txt",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "vocab.json",
]


def save_steps(out_dir, steps):
    """A run's checkpoints of a GPT-2-shaped model, one per step, each with weights of its own; {step: its wte}."""
    model, gpt_config = small_model(vocab_size=50304, **GPT2_SHAPED)  # padded, as a run's
    saved = {}
    for step in steps:
        weights = {name: tensor + step for name, tensor in model.state_dict().items()}
        state = {"model": weights, "config": {"GPTConfig": asdict(gpt_config)}, "meta": {"tokenizer": "gpt2"}}
        checkpoint.save(str(out_dir / "ckpt"), step, state, healthy=True)
        saved[step] = weights["wte.weight"][:50257]  # the rows an export keeps
    return saved


def exported_wte(dest):
    return safetensors_format.read_safetensors(str(dest / "model.safetensors"))["transformer.wte.weight"]


@needs_gpt2
def test_export_deletes_and_changes_nothing_it_did_not_write(tmp_path):
    """Beside the folder (x.old/ and x.tmp/, the names an export once staged through, here a user's) and in an
    earlier export (a file the user added) nothing but the export's own files is touched."""
    out_dir, dest = tmp_path / "run", tmp_path / "out" / "x"
    wte = save_steps(out_dir, [100])
    theirs = {dest.parent / "x.old" / "weights.bin": b"mine", dest.parent / "x.tmp" / "notes.txt": b"keep me"}
    for path, content in theirs.items():
        path.parent.mkdir(parents=True)
        path.write_bytes(content)
    export = ["--export_hf", str(dest), "--out_dir", str(out_dir)]
    train.main(export)
    assert {path: path.read_bytes() for path in theirs} == theirs
    assert sorted(p.name for p in dest.parent.iterdir()) == ["x", "x.old", "x.tmp"]
    assert sorted(p.name for p in dest.iterdir()) == EXPORT_FILES
    torch.testing.assert_close(exported_wte(dest), wte[100])
    (dest / "lm_eval_results.json").write_text('{"hellaswag": 0.25}')
    wte.update(save_steps(out_dir, [200]))
    train.main(export)  # the newest checkpoint now: step 200's, over the export of step 100
    assert (dest / "lm_eval_results.json").read_text() == '{"hellaswag": 0.25}'
    assert sorted(p.name for p in dest.iterdir()) == sorted([*EXPORT_FILES, "lm_eval_results.json"])  # no temporary
    torch.testing.assert_close(exported_wte(dest), wte[200])
    assert {path: path.read_bytes() for path in theirs} == theirs


@needs_gpt2
def test_an_export_that_fails_removes_only_what_it_made(tmp_path, monkeypatch):
    model, gpt_config = small_model(vocab_size=50304, **GPT2_SHAPED)
    before = tmp_path / "earlier"
    transfer.export_hf(model.state_dict(), gpt_config, "gpt2", str(before))
    (before / "notes.txt").write_text("mine")
    contents = {p.name: p.read_bytes() for p in before.iterdir()}

    def full_disk(tensors, metadata):
        def write(f):
            f.write(b"half of it")
            raise OSError(28, "No space left on device")

        return write

    monkeypatch.setattr(safetensors_format, "safetensors_writer", full_disk)
    for dest in (before, tmp_path / "new"):
        with pytest.raises(OSError, match="No space left"):
            transfer.export_hf(model.state_dict(), gpt_config, "gpt2", str(dest))
    assert {p.name: p.read_bytes() for p in before.iterdir()} == contents  # no temporary file left, nothing changed
    assert not (tmp_path / "new").exists()  # the folder it made, removed


@needs_gpt2
def test_export_refuses_a_newest_checkpoint_that_does_not_verify_unless_ckpt_step_names_one(tmp_path):
    out_dir, dest = tmp_path / "run", tmp_path / "hf"
    wte = save_steps(out_dir, [100, 200])
    state_file = out_dir / "ckpt" / "step_0000200" / checkpoint.STATE_FILE
    state_file.write_bytes(state_file.read_bytes()[:-100])  # cut short, as a full disk leaves it
    export = ["--export_hf", str(dest), "--out_dir", str(out_dir)]
    with pytest.raises(
        SystemExit,
        match=r"--export_hf exports the run's newest checkpoint, and the checkpoint of step 200 in .*ckpt cannot be "
        r"read: state\.pt does not match its sha256 \(truncated or corrupted\)\. The checkpoints there that verify: "
        r"step 100; name one with --ckpt_step N",
    ):
        train.main(export)
    assert not dest.exists()
    with pytest.raises(
        SystemExit, match=r"--export_hf: the checkpoint of step 150 in .*there is no such checkpoint.*step 100"
    ):
        train.main([*export, "--ckpt_step", "150"])
    assert not dest.exists()
    train.main([*export, "--ckpt_step", "100"])
    torch.testing.assert_close(exported_wte(dest), wte[100])


def test_initial_weights_from_a_run_takes_its_newest_healthy_checkpoint(tmp_path):
    model, gpt_config = small_model()
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    (out_dir / "run.json").write_text("{}")
    with pytest.raises(ValueError, match=r"--init_from .*run is a run with no healthy checkpoint in .*ckpt"):
        transfer.initial_weights(str(out_dir))
    read = {"source": "stdlib", "source_sha256": "ab" * 32, "tokenizer": "byte", "val_fraction": 0.1}
    identity = {"GPTConfig": asdict(gpt_config), "data": read}  # a checkpoint records it as run.json does, a dict
    state = {"model": model.state_dict(), "config": identity, "meta": {"tokenizer": "byte"}}
    checkpoint.save(str(out_dir / "ckpt"), 200, state, healthy=True)
    checkpoint.save(str(out_dir / "ckpt"), 300, state, healthy=False)  # a spike's: not a start
    read_gpt_config, state_dict, tokenizer, description, data = transfer.initial_weights(str(out_dir))
    expected = (ArmsConfig.of(gpt_config), "byte", f"{out_dir}, its checkpoint of step 200")  # with its arms
    assert (read_gpt_config, tokenizer, description) == expected
    assert data == read  # what the run read, for the next run to say what it reads differently
    assert all(torch.equal(state_dict[k], v) for k, v in model.state_dict().items())


def test_initial_weights_refuses_what_it_cannot_read(tmp_path, monkeypatch):
    with pytest.raises(
        ValueError,
        match=r"--init_from 'nowhere' is none of: a run's out_dir .*a Hugging Face GPT-2 folder .*a \.safetensors "
        r"file, or one of gpt2, gpt2-medium, gpt2-large, gpt2-xl, SmolLM2-135M",
    ):
        transfer.initial_weights("nowhere")
    pickled = tmp_path / "old_hf"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin only.*save_pretrained"):
        transfer.initial_weights(str(pickled))


def serve_from_a_local_hub(monkeypatch, tmp_path, repo, revision, contents, lfs=()):
    """A hub in a folder, as file:// URLs: the files of repo at revision, and the API's listing of them, which
    gives the sha256 (the Git LFS oid) of those named in lfs."""
    hub = tmp_path / "hub"
    served = hub / repo / "resolve" / revision
    served.mkdir(parents=True)
    for name, data in contents.items():
        (served / name).write_bytes(data)
    listing = [
        {"path": name, "type": "file", **({"lfs": {"oid": file_sha256(served / name)}} if name in lfs else {})}
        for name in contents
    ]
    api = hub / "api" / "models" / repo / "tree"
    api.mkdir(parents=True)
    (api / revision).write_text(json.dumps(listing))
    monkeypatch.setattr(transfer, "HUB", hub.as_uri())
    monkeypatch.setattr(transfer, "NAMED_WEIGHTS_DIR", str(tmp_path / "weights"))
    return served


def test_a_named_base_is_fetched_once_and_checked_against_its_sha256(tmp_path, monkeypatch):
    model, gpt_config = small_model(**GPT2_SHAPED)
    weights = tmp_path / "weights.safetensors"
    safetensors_format.write_safetensors(str(weights), hf_layouts.state_dict_to_hf(model.state_dict(), 256))
    served = serve_from_a_local_hub(
        monkeypatch, tmp_path, "someone/tiny", "abc123", {"model.safetensors": weights.read_bytes()}
    )
    base = transfer.NamedBase("someone/tiny", "abc123", {"model.safetensors": "0" * 64}, gpt_config)
    monkeypatch.setitem(transfer.NAMED_BASES, "tiny", base)
    with pytest.raises(ValueError, match=rf"has sha256 {file_sha256(weights)}, expected 0000"):
        transfer.initial_weights("tiny")
    assert not (tmp_path / "weights" / "tiny" / "model.safetensors").exists()
    monkeypatch.setitem(transfer.NAMED_BASES, "tiny", base._replace(files={"model.safetensors": file_sha256(weights)}))
    read_gpt_config, state_dict, tokenizer, description, data = transfer.initial_weights("tiny")
    assert (read_gpt_config, tokenizer, description) == (gpt_config, "gpt2", "tiny (at abc123)")
    assert all(torch.equal(state_dict[k], v) for k, v in model.state_dict().items())
    assert (tmp_path / "weights" / "tiny" / "model.safetensors").exists()  # kept: the next start reads it
    # offline: --init_url names a folder holding the files (a file's URL is refused, naming the folder to give)
    (tmp_path / "weights" / "tiny" / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"--init_url .*/model\.safetensors names a file: give the folder"):
        transfer.initial_weights("tiny", (served / "model.safetensors").as_uri())
    assert transfer.initial_weights("tiny", served.as_uri()).description == "tiny (at abc123)"


def test_a_named_base_without_a_published_hash_is_checked_against_the_hubs(tmp_path, monkeypatch, capsys):
    model, gpt_config = small_model(**GPT2_SHAPED)
    weights = tmp_path / "weights.safetensors"
    safetensors_format.write_safetensors(str(weights), hf_layouts.state_dict_to_hf(model.state_dict(), 256))
    contents = {"model.safetensors": weights.read_bytes()}
    serve_from_a_local_hub(monkeypatch, tmp_path, "someone/tiny", "abc123", contents, lfs=["model.safetensors"])
    base = transfer.NamedBase("someone/tiny", "abc123", {"model.safetensors": None}, gpt_config)
    monkeypatch.setitem(transfer.NAMED_BASES, "tiny", base)
    transfer.initial_weights("tiny")
    said = capsys.readouterr().out.splitlines()
    assert [line for line in said if line.startswith("tiny:")] == [
        "tiny: no sha256 of its model.safetensors was published to pin, so it is checked against the hub's"
    ]
    # a hub whose listing holds no hash for the file: refused, pointing at a folder downloaded by hand
    serve_from_a_local_hub(monkeypatch, tmp_path / "other", "someone/tiny", "abc123", contents)
    with pytest.raises(ValueError, match=r"no sha256 pinned here for its model\.safetensors, and the hub's could not "
                       r"be read .*Download the folder yourself from .*someone/tiny/tree/abc123"):  # fmt: skip
        transfer.initial_weights("tiny")


def test_a_named_base_gives_the_run_its_architecture_before_any_download(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing is fetched by reading the flags
    _, _, configs = config.parse_args(["--init_from", "SmolLM2-135M"])
    model = configs.model
    assert (model.arch, model.n_layer, model.n_head, model.n_kv_head, model.n_embd) == ("llama", 30, 9, 3, 576)
    assert (model.hidden, model.rope_theta, model.tie_embeddings, model.block_size) == (
        1536,
        1e5,
        True,
        128,
    )  # the preset's
    assert configs.data.tokenizer == str(tmp_path / "data" / "weights" / "SmolLM2-135M")  # its tokenizer.json
    assert config.parse_args(["--init_from", "gpt2", "--preset", "shakespeare"])[2].model.n_embd == 768
    with pytest.raises(ValueError, match="--n_layer 4 contradicts --init_from gpt2, whose config.json says n_layer 12"):
        config.parse_args(["--init_from", "gpt2", "--n_layer", "4"])
    assert not (tmp_path / "data").exists()
