"""--config FILE: a run's run.json repeats the run, flags go over the file, bad keys are refused by name, TOML
reads as JSON does, and the presets are such files (config.py, presets/)."""

import json

import pytest
from conftest import ROOT, write_word_corpus

import train
from machinery.components.run_folder import read_jsonl
from machinery.job import config
from machinery.job.config import parse_args, read_config_file

# a run small enough for a unit test: 1 layer of width 32, 20 steps, every loss logged
# fmt: off
QUICK = [
    "--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--block_size", "16", "--batch_size", "4",
    "--max_iters", "20", "--eval_interval", "10", "--eval_iters", "2", "--log_interval", "1", "--ckpt_interval", "10",
    "--num_samples", "0", "--dtype", "float32",
]
# fmt: on


def losses(out):
    return {r["step"]: r["loss"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A 20-step run of a word corpus: (its out_dir, the folder it lives in)."""
    folder = tmp_path_factory.mktemp("config_file")
    corpus = write_word_corpus(folder / "words.txt", 400)
    out = folder / "first"
    train.main([str(a) for a in ["--source", corpus, "--data_dir", folder / "data", "--out_dir", out, *QUICK]])
    return out, folder


def test_run_json_repeats_the_run_under_a_new_out_dir(first_run):
    out, folder = first_run
    recorded = json.loads((out / "run.json").read_text())
    assert recorded["config"]["preset"] == "tiny" and recorded["config"]["model"]["n_layer"] == 1
    assert "overwrite" not in recorded["config"]["train"], "what one command does is no setting: never recorded"
    again = folder / "again"
    train.main(["--config", str(out / "run.json"), "--out_dir", str(again)])
    first, repeated = losses(out), losses(again)
    assert list(first) == list(range(20)), "the first run logs every one of its 20 steps"
    assert repeated == first, "the same config, seed and data take the same steps: the same losses, step by step"
    rerun = json.loads((again / "run.json").read_text())
    assert {k: v for k, v in rerun.items() if k != "config"} == {k: v for k, v in recorded.items() if k != "config"}
    assert rerun["config"]["train"].pop("out_dir") == str(again)
    assert recorded["config"]["train"].pop("out_dir") == str(out) and rerun["config"] == recorded["config"]
    # the config is not the identity: another layout and a larger max_iters continue the run, and are recorded
    layout = ["--batch_size", "2", "--gradient_accumulation_steps", "2", "--max_iters", "22"]
    train.main(["--config", str(again / "run.json"), *layout])
    continued = json.loads((again / "run.json").read_text())
    assert list(losses(again)) == list(range(22)) and continued["TrainConfig"]["max_iters"] == 22
    assert (continued["config"]["train"]["batch_size"], continued["config"]["train"]["max_iters"]) == (2, 22)


def test_flags_beside_config_go_over_it(first_run, tmp_path):
    out, _ = first_run
    _, _, configs = parse_args(["--config", str(out / "run.json"), "--n_layer", "3", "--learning_rate", "1e-3"])
    assert (configs.model.n_layer, configs.train.learning_rate) == (3, 1e-3)
    assert (configs.model.n_embd, configs.train.max_iters) == (32, 20), "what no flag names comes from the file"
    # default < preset < file < flag, and --preset names the preset the file goes over
    file = tmp_path / "mine.json"
    file.write_text(json.dumps({"preset": "shakespeare", "train": {"learning_rate": 1e-3, "max_iters": 50}}))
    preset, _, configs = parse_args(["--config", str(file), "--max_iters", "70"])
    assert preset == "shakespeare" and configs.model.block_size == 64 and configs.data.source == "shakespeare"
    assert (configs.train.learning_rate, configs.train.max_iters) == (1e-3, 70)
    preset, _, configs = parse_args(["--config", str(file), "--preset", "tiny"])
    assert preset == "tiny" and configs.model.block_size == 128 and configs.train.learning_rate == 1e-3
    # a run.json sets every setting: another preset beside it would only rename it (and its default out_dir); so
    # does one recorded before a setting existed (--plot here), whose missing setting reads as its default
    with pytest.raises(SystemExit):
        parse_args(["--config", str(out / "run.json"), "--preset", "shakespeare"])
    older = json.loads((out / "run.json").read_text())
    del older["config"]["train"]["plot"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    with pytest.raises(SystemExit):
        parse_args(["--config", str(tmp_path / "older.json"), "--preset", "shakespeare"])
    assert parse_args(["--config", str(tmp_path / "older.json")])[2].train.plot is True


@pytest.mark.parametrize(
    "content, expected",
    [
        ({"train": {"n_layr": 3}}, ["unknown key train.n_layr", "did you mean model.n_layer?", "train: out_dir"]),
        ({"train": {"n_layer": 3}}, ["train.n_layer", "goes in model.n_layer"]),
        ({"n_layer": 3}, ["n_layer at the top level", "model.n_layer"]),
        ({"modle": {}}, ["unknown key modle", "did you mean model?"]),
        ({"train": {"max_iters": 2.5}}, ["train.max_iters = 2.5: expected an integer"]),
        ({"train": {"compile": "yes"}}, ["train.compile = 'yes': expected true or false"]),
        ({"model": {"vocab_size": 300}}, ["unknown key model.vocab_size"]),
        ({"train": {"overwrite": True}}, ["train.overwrite is what one command does", "--overwrite"]),
        ({"GPTConfig": {"n_layer": 2}, "TrainConfig": {}}, ["did not record its configuration", "flags"]),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_key(tmp_path, content, expected):
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(content))
    with pytest.raises(ValueError) as error:
        parse_args(["--config", str(file)])
    assert str(file) in str(error.value) and all(part in str(error.value) for part in expected), str(error.value)


def test_a_bad_file_stops_train_py_with_its_message(tmp_path, capsys):
    file = tmp_path / "bad.json"
    file.write_text('{"train": {"n_layr": 3}}')
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", str(file)])
    assert str(exit_info.value.code).startswith("error: ") and "train.n_layr" in str(exit_info.value.code)


def test_toml_reads_as_json_does(tmp_path, monkeypatch):
    toml, same = tmp_path / "mine.toml", tmp_path / "mine.json"
    toml.write_text(
        'preset = "shakespeare"\nabout = "TOML has comments"\n\n[model]\nn_layer = 6  # deeper\n\n'
        "[train]\nlearning_rate = 3e-4\ncompile = false\n"
    )
    content = {"preset": "shakespeare", "model": {"n_layer": 6}, "train": {"learning_rate": 3e-4, "compile": False}}
    same.write_text(json.dumps(content))
    if config.tomllib is not None:
        assert parse_args(["--config", str(toml)]) == parse_args(["--config", str(same)])
        assert parse_args(["--config", str(toml)])[2].model.n_layer == 6
    monkeypatch.setattr(config, "tomllib", None)  # Python 3.10: the file is refused, saying why
    with pytest.raises(ValueError, match=r"mine\.toml: TOML is read with tomllib, which came with Python 3\.11"):
        parse_args(["--config", str(toml)])


# the presets as config.py held them before they became files in presets/
# fmt: off
OLD_PRESETS = {
    "tiny": {},
    "shakespeare": dict(
        source="shakespeare", block_size=64, batch_size=12, n_layer=4, n_head=4, n_embd=128,
        max_iters=2000, learning_rate=2e-3, min_lr=1e-4, lr_decay_iters=1500, warmup_iters=100, beta2=0.99,
        eval_iters=144, log_interval=10,
    ),
    "gpt2-small": dict(
        source="", tokenizer="gpt2", block_size=1024, n_layer=12, n_head=12, n_embd=768,
        norm="layernorm", bias=True, activation="gelu_tanh",
        batch_size=16, gradient_accumulation_steps=32, lanes=512, max_iters=19073,
        learning_rate=6e-4, min_lr=6e-5, warmup_iters=700, beta2=0.95,
        log_interval=10, eval_interval=500, eval_iters=4, compile=True, benchmark="hellaswag",
    ),
}
# fmt: on


@pytest.mark.parametrize("name", OLD_PRESETS)
def test_presets_are_files_that_load_to_the_same_configs(name):
    path = ROOT / "presets" / f"{name}.json"
    assert read_config_file(path) == (None, OLD_PRESETS[name], False) and config.PRESETS[name] == OLD_PRESETS[name]
    by_name, by_file = parse_args(["--preset", name]), parse_args(["--config", str(path)])
    assert by_name[2] == by_file[2], "--preset NAME and --config presets/NAME.json are one code path"
    assert list(config.PRESETS)[:3] == ["tiny", "shakespeare", "gpt2-small"], "--help lists the default first"
    model, cfg = by_name[2].model, by_name[2].train
    known = {"tiny": (4, 128, 2e-3), "shakespeare": (4, 64, 2e-3), "gpt2-small": (12, 1024, 6e-4)}[name]
    assert (model.n_layer, model.block_size, cfg.learning_rate) == known
