"""tracking.py (--log_to tensorboard,wandb): the trackers get what metrics.jsonl and incidents.jsonl get, by step, and
the run's configuration; a missing package or an unknown name is refused at start-up, naming what to do.

TensorBoard is read back with its own reader; W&B through a stub module that records its calls, and, where the
wandb package is installed, for real in offline mode (requirements-test.txt leaves it out: it is large)."""

import glob
import json
import struct
import sys
import types

import numpy as np
import pytest
from conftest import write_word_corpus

import train
from machinery.components.run_folder import read_jsonl
from machinery.components.tracking import wandb_mode

# a run of a few seconds: 2 layers of width 32, a log line every step, an evaluation every 5, a checkpoint every 4
# fmt: off
TINY = [
    "--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "16", "--batch_size", "4",
    "--eval_iters", "2", "--log_interval", "1", "--eval_interval", "5", "--ckpt_interval", "4", "--num_samples", "0",
]
# fmt: on


def run_args(tmp_path, *more):
    corpus = write_word_corpus(tmp_path / "words.txt", 400)
    return [
        str(a)
        for a in ["--source", corpus, "--data_dir", tmp_path / "data", "--out_dir", tmp_path / "run", *TINY, *more]
    ]


def run_main(argv, capsys):
    """train.main in this process, expected to stop; returns its exit message."""
    with pytest.raises(SystemExit) as exit_info:
        train.main([str(a) for a in argv])
    capsys.readouterr()
    return str(exit_info.value.code)


def flat(record, prefix=""):
    """A record as the trackers are to get it: nested dicts as "outer/inner"."""
    out = {}
    for key, value in record.items():
        out.update(flat(value, f"{prefix}{key}/") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def logged_scalars(records):
    """Sorted (tag, step, value as float32) of every number in the records but the step: what TensorBoard keeps."""
    return sorted(
        (tag, record["step"], float(np.float32(value)))
        for record in records
        for tag, value in flat(record).items()
        if tag != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    )


def event_scalars(folder, purge=True):
    """Sorted (tag, step, value) of every scalar in folder's event files, as TensorBoard's reader shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0}, purge_orphaned_data=purge)
    reader.Reload()
    return sorted((tag, e.step, e.value) for tag in reader.Tags()["scalars"] for e in reader.Scalars(tag)), reader


def test_tensorboard_holds_what_metrics_jsonl_holds(tmp_path, capsys):
    """Every scalar, tag by tag and step by step, through a rollback (nan@6 rolls back to the checkpoint of step 4)
    and a continued run (--max_iters 10, then 12): TensorBoard shows the timeline metrics.jsonl keeps, the incident
    in a run of its own, and the configuration as hyperparameters and text. --overwrite clears it all."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as PluginReader
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    args, out = run_args(tmp_path, "--log_to", "tensorboard"), tmp_path / "run"
    train.main([*args, "--max_iters", "10", "--inject", "nan@6"])
    train.main([*args, "--max_iters", "12"])
    records = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(13)) and "incidents.jsonl" in {p.name for p in out.iterdir()}
    got, reader = event_scalars(out / "tensorboard" / "metrics")
    want = logged_scalars(records)
    assert {"loss", "lr", "grad_norm", "val_loss", "tokens_per_s", "state_bytes"} <= {tag for tag, _, _ in want}
    assert got == want, f"TensorBoard and metrics.jsonl differ at {sorted(set(got) ^ set(want))[:5]}"
    # the file was sent the abandoned steps too (4 and 5 before the rollback, the final check at 10): hidden, not lost
    unpurged, _ = event_scalars(out / "tensorboard" / "metrics", purge=False)
    assert len([s for tag, s, _ in unpurged if tag == "loss"]) == len([s for tag, s, _ in got if tag == "loss"]) + 2
    assert (
        len([s for tag, s, _ in unpurged if tag == "val_loss"])
        == len([s for tag, s, _ in got if tag == "val_loss"]) + 2
    )

    config = reader.Tensors("config/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert '"log_to": "tensorboard"' in config and '"max_iters": 12' in config and '"identity"' in config
    plugin_reader = PluginReader(str(out / "tensorboard" / "metrics"))
    plugin_reader.Reload()
    session = HParamsPluginData.FromString(plugin_reader.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    hparams = session.session_start_info.hparams
    assert hparams["train/log_to"].string_value == "tensorboard" and hparams["model/n_embd"].number_value == 32
    assert hparams["identity/TrainConfig/global_batch"].number_value == 4

    (incident,) = read_jsonl(out / "incidents.jsonl")
    rungs, incidents = event_scalars(out / "tensorboard" / "incidents")
    assert rungs == [("incident/rung", incident["step"], float(incident["rung"]))] == [("incident/rung", 6, 1.0)]
    text = incidents.Tensors("incident/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "nonfinite at step 6 -> rung 1 (skip)" in text and '"restored_step": 4' in text

    train.main([str(a) for a in [*run_args(tmp_path), "--max_iters", "2", "--overwrite"]])
    assert not (out / "tensorboard").exists()  # a run started afresh there keeps nothing of the one it replaced


def stub_wandb():
    """A module named wandb whose init returns a run that records every call: (name, arguments)."""
    calls = []

    class Run:
        def define_metric(self, *args, **kwargs):
            calls.append(("define_metric", args, kwargs))

        def log(self, data):
            calls.append(("log", data))

        def finish(self):
            calls.append(("finish",))

    module = types.ModuleType("wandb")
    module.init = lambda **kwargs: calls.append(("init", kwargs)) or Run()
    return module, calls


@pytest.fixture
def no_wandb_login(monkeypatch, tmp_path):
    """No W&B variable set and no ~/.netrc: as on a machine where nobody ran `wandb login`."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_wandb_gets_every_record_by_step_offline(tmp_path, monkeypatch, capsys, no_wandb_login):
    """Through a stub wandb: one offline run in out_dir with the configuration, every record of metrics.jsonl as one
    log call against our step (a mix's val_loss_by_source and mix_tokens flattened), then finish."""
    stub, calls = stub_wandb()
    monkeypatch.setitem(sys.modules, "wandb", stub)
    corpus = {name: write_word_corpus(tmp_path / f"{name}.txt", 300) for name in ("prose", "code")}
    mix = tmp_path / "mix.json"
    mix.write_text(json.dumps({"sources": {k: str(v) for k, v in corpus.items()}, "weights": {"prose": 1, "code": 3}}))
    out = tmp_path / "run"
    # fmt: off
    train.main([str(a) for a in [
        "--mix", mix, "--data_dir", tmp_path / "data", "--out_dir", out, *TINY, "--max_iters", "6", "--log_to", "wandb",
    ]])
    # fmt: on
    (init,) = [c[1] for c in calls if c[0] == "init"]
    assert calls[0][0] == "init" and init["mode"] == "offline" and init["dir"] == str(out)
    assert init["project"] == "minipretrain" and init["name"] == init["group"] == "run"
    assert init["config"]["train"]["mix"] == str(mix) and init["config"]["identity"]["data"]["mix"]
    assert ("define_metric", ("*",), {"step_metric": "step"}) in calls
    logged = [c[1] for c in calls if c[0] == "log"]
    assert logged == [flat(r) for r in read_jsonl(out / "metrics.jsonl")]
    assert "val_loss_by_source/code" in logged[0] and "mix_tokens/prose" in logged[-1]
    assert calls[-1] == ("finish",)

    calls.clear()  # --eval_only's record goes where the run's records went, in a W&B run of its own
    # fmt: off
    train.main([str(a) for a in [
        "--eval_only", "--mix", mix, "--data_dir", tmp_path / "data", "--out_dir", out, *TINY, "--max_iters", "6",
        "--log_to", "wandb",
    ]])
    # fmt: on
    last = read_jsonl(out / "metrics.jsonl")[-1]
    assert last["eval_only"] and [c[0] for c in calls] == ["init", "define_metric", "define_metric", "log", "finish"]
    assert calls[3][1] == {**flat(last), "eval_only": "true"} and calls[3][1]["step"] == 6  # a flag goes as text


@pytest.mark.parametrize("name, module", [("tensorboard", "torch.utils.tensorboard"), ("wandb", "wandb")])
def test_a_missing_package_is_named_at_start_up(name, module, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, module, None)  # import fails, as where the package is not installed
    message = run_main(run_args(tmp_path, "--log_to", name), capsys)
    assert f"--log_to {name} needs the {name} package: pip install {name}" in message
    assert not (tmp_path / "run").exists()  # refused before the run's folder or its data


@pytest.mark.parametrize(
    "log_to, expected",
    [("tensorbord", ["'tensorbord'", "did you mean tensorboard?"]), ("tensorboard,mlflow", ["'mlflow'"])],
)
def test_an_unknown_tracker_is_refused_naming_the_valid_ones(log_to, expected, tmp_path, capsys):
    message = run_main(run_args(tmp_path, "--log_to", log_to), capsys)
    assert all(e in message for e in [*expected, "choose tensorboard, wandb, or both: --log_to tensorboard,wandb"])
    assert not (tmp_path / "run").exists()


def test_wandb_is_offline_unless_told_or_logged_in(tmp_path, monkeypatch, no_wandb_login):
    assert wandb_mode() == "offline"  # never a login prompt
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password not-a-real-key\n")
    assert wandb_mode() == "online"  # `wandb login` wrote its key there
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"  # W&B's own variable decides
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("NETRC")
    monkeypatch.setenv("WANDB_API_KEY", "not-a-real-key")
    assert wandb_mode() == "online"


def wandb_history(path):
    """The history rows of an offline W&B run file (run-ID.wandb): a 7-byte header, then LevelDB's log format
    (32 KiB blocks of chunks: CRC, length, type full/first/middle/last), each record a wandb Record protobuf."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, position, block, chunks, rows = open(path, "rb").read(), 7, 32768, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunks += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record, chunks = Record.FromString(chunks), b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                )
    return rows


def test_the_real_wandb_package_offline(tmp_path, monkeypatch, capsys, no_wandb_login):
    """Where wandb is installed: a run with --log_to wandb writes an offline run into out_dir/wandb whose history
    holds metrics.jsonl's records, value for value."""
    wandb = pytest.importorskip("wandb")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing written outside tmp_path
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's capture of stdout alone
    try:
        train.main(run_args(tmp_path, "--log_to", "wandb", "--max_iters", "6"))
    finally:
        wandb.teardown()  # stop W&B's service process
    (path,) = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*" / "run-*.wandb"))
    rows = [{k: v for k, v in row.items() if not k.startswith("_")} for row in wandb_history(path)]
    assert rows == [flat(r) for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
