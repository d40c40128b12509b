"""mixture.py: the weights a schedule gives, the mix file's refusals, the shares of rows each source gets,
and the MixedStream's rows on any data-parallel layout and across a resume."""

import json
import random

import numpy as np
import pytest
import torch

from data import TokenStream
from machinery.components.run_folder import data_changes
from machinery.corpora.corpus import DataConfig
from machinery.corpora.mixture import (
    Change,
    Mix,
    MixedStream,
    assign_rows,
    prepare_sources,
    read_mix,
    weight_changes,
    weights_at,
)

T = 4  # block size
SOURCE_TOKENS = 10_000  # source i's file holds the tokens i * 10_000 + 0, 1, 2, ...: a token tells its source


def write_mix(tmp_path, spec, name="mix.json"):
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return read_mix(path)


@pytest.fixture
def token_files(tmp_path):
    """{name: path} of three token files, uint16, whose tokens say which file and which position they come from."""
    files = {}
    for i, (name, n_tokens) in enumerate([("a", 9_001), ("b", 4_001), ("c", 2_001)]):
        files[name] = tmp_path / f"{name}.bin"
        (i * SOURCE_TOKENS + np.arange(n_tokens)).astype(np.uint16).tofile(files[name])
    return files


def mixed_stream(mix, token_files, batch_size, rank=0, world_size=1, accumulation_steps=1, order_seeds=None):
    """A MixedStream over one TokenStream per source of the mix, as train.py would open them."""
    streams = {
        name: TokenStream(
            token_files[name], np.uint16, batch_size, T, rank, world_size, 1, (order_seeds or {}).get(name, 0)
        )
        for name in mix.sources
    }
    return MixedStream(mix, streams, batch_size, rank, world_size, accumulation_steps)


def sources_of(x):
    """The source name of each row of x."""
    return ["abc"[int(row[0]) // SOURCE_TOKENS] for row in x]


# ----------------------------------------------------------------------------
# weights_at


def test_weights_at_before_during_and_after_a_ramp():
    mix = Mix(
        sources={"a": "x", "b": "y"},
        weights={"a": 0.75, "b": 0.25},
        schedule=[Change(10, {"a": 0.25, "b": 0.75}, ramp=4), Change(20, {"a": 1.0, "b": 0.0})],
    )
    assert weights_at(mix, 0) == weights_at(mix, 9) == {"a": 0.75, "b": 0.25}
    assert weights_at(mix, 10) == {"a": 0.75, "b": 0.25}  # a ramp starts from the weights before it
    assert weights_at(mix, 12) == pytest.approx({"a": 0.5, "b": 0.5})  # the midpoint
    assert weights_at(mix, 14) == weights_at(mix, 19) == {"a": 0.25, "b": 0.75}
    assert weights_at(mix, 20) == weights_at(mix, 10**6) == {"a": 1.0, "b": 0.0}  # no ramp: at once
    for step in range(25):
        assert sum(weights_at(mix, step).values()) == pytest.approx(1)


def test_read_mix_normalizes_the_weights(tmp_path):
    mix = write_mix(
        tmp_path,
        {
            "sources": {"prose": "shakespeare", "code": "stdlib"},
            "weights": {"code": 7, "prose": 3},
            "schedule": [{"step": 100, "weights": {"prose": 1, "code": 1}, "ramp": 10}],
        },
    )
    assert mix.weights == pytest.approx({"prose": 0.3, "code": 0.7})
    assert list(mix.weights) == ["prose", "code"]  # in the order of "sources": it breaks ties
    assert weights_at(mix, 200) == {"prose": 0.5, "code": 0.5}
    assert weights_at(mix, 105) == pytest.approx({"prose": 0.4, "code": 0.6})
    assert mix.schedule[0].ramp == 10


def test_the_canonical_form_ignores_scale_and_survives_json(tmp_path):
    one = write_mix(tmp_path, {"sources": {"a": "x", "b": "y"}, "weights": {"a": 1, "b": 3}}, "one.json")
    two = write_mix(tmp_path, {"sources": {"a": "x", "b": "y"}, "weights": {"a": 0.5, "b": 1.5}}, "two.json")
    assert one.as_dict() == two.as_dict() == json.loads(json.dumps(one.as_dict()))


# ----------------------------------------------------------------------------
# read_mix refusals: each names the file and the key

GOOD_SOURCES = {"a": "x", "b": "y"}
GOOD_WEIGHTS = {"a": 1, "b": 1}


@pytest.mark.parametrize(
    "text, key, says",
    [
        ("{not json", None, "is not JSON"),
        ("[1, 2]", None, "holds a JSON list"),
        (json.dumps({"weights": GOOD_WEIGHTS}), '"sources"', "missing"),
        (json.dumps({"sources": GOOD_SOURCES}), '"weights"', "missing"),
        (json.dumps({"sources": {}, "weights": {}}), '"sources"', "non-empty"),
        (json.dumps({"sources": {"a": 3}, "weights": {"a": 1}}), '"sources.a"', "not a --source"),
        (json.dumps({"sources": GOOD_SOURCES, "weights": {"a": 1, "b": 1, "c": 1}}), '"weights.c"', "not one of"),
        (json.dumps({"sources": GOOD_SOURCES, "weights": {"a": 1}}), '"weights"', "no weight to b"),
        (json.dumps({"sources": GOOD_SOURCES, "weights": {"a": 1, "b": -1}}), '"weights.b"', "negative"),
        (json.dumps({"sources": GOOD_SOURCES, "weights": {"a": 1, "b": "1"}}), '"weights.b"', "not a number"),
        ('{"sources": {"a": "x"}, "weights": {"a": NaN}}', '"weights.a"', "not a number"),
        (json.dumps({"sources": GOOD_SOURCES, "weights": {"a": 0, "b": 0}}), '"weights"', "all zero"),
        (json.dumps({"sources": GOOD_SOURCES, "weights": GOOD_WEIGHTS, "weight": 1}), '"weight"', "unknown key"),
        (json.dumps({"sources": GOOD_SOURCES, "weights": GOOD_WEIGHTS, "schedule": {}}), '"schedule"', "list"),
        (
            json.dumps({"sources": GOOD_SOURCES, "weights": GOOD_WEIGHTS, "schedule": [{"weights": GOOD_WEIGHTS}]}),
            '"schedule[0].step"',
            "missing",
        ),
        (
            json.dumps({"sources": GOOD_SOURCES, "weights": GOOD_WEIGHTS, "schedule": [{"step": 5}]}),
            '"schedule[0].weights"',
            "missing",
        ),
        (
            json.dumps({"sources": GOOD_SOURCES, "weights": GOOD_WEIGHTS, "schedule": [{"step": 1.5, "weights": {}}]}),
            '"schedule[0].step"',
            "whole number",
        ),
        (
            json.dumps(
                {"sources": GOOD_SOURCES, "weights": GOOD_WEIGHTS, "schedule": [{"step": 5, "weights": {"a": 1}}]}
            ),
            '"schedule[0].weights"',
            "no weight to b",
        ),
        (
            json.dumps(
                {
                    "sources": GOOD_SOURCES,
                    "weights": GOOD_WEIGHTS,
                    "schedule": [{"step": 5, "weights": GOOD_WEIGHTS, "rampp": 3}],
                }
            ),
            '"schedule[0].rampp"',
            "unknown key",
        ),
        (
            json.dumps(
                {
                    "sources": GOOD_SOURCES,
                    "weights": GOOD_WEIGHTS,
                    "schedule": [{"step": 5, "weights": GOOD_WEIGHTS}, {"step": 5, "weights": GOOD_WEIGHTS}],
                }
            ),
            '"schedule[1].step"',
            "increasing step order",
        ),
        (
            json.dumps(
                {
                    "sources": GOOD_SOURCES,
                    "weights": GOOD_WEIGHTS,
                    "schedule": [
                        {"step": 5, "weights": GOOD_WEIGHTS, "ramp": 6},
                        {"step": 10, "weights": GOOD_WEIGHTS},
                    ],
                }
            ),
            '"schedule[0].ramp"',
            "ramps until step 11, past schedule[1] at step 10",
        ),
    ],
)
def test_read_mix_refuses_naming_the_file_and_the_key(tmp_path, text, key, says):
    path = tmp_path / "mix.json"
    path.write_text(text)
    with pytest.raises(ValueError) as refused:
        read_mix(path)
    message = str(refused.value)
    assert str(path) in message and says in message
    assert key is None or key in message


def test_a_ramp_may_end_where_the_next_entry_starts(tmp_path):
    mix = write_mix(
        tmp_path,
        {
            "sources": GOOD_SOURCES,
            "weights": {"a": 1, "b": 0},
            "schedule": [{"step": 5, "weights": {"a": 0, "b": 1}, "ramp": 5}, {"step": 10, "weights": GOOD_WEIGHTS}],
        },
    )
    assert weights_at(mix, 9) == pytest.approx({"a": 0.2, "b": 0.8})
    assert weights_at(mix, 10) == {"a": 0.5, "b": 0.5}


def test_a_missing_mix_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="nowhere.json: no such file"):
        read_mix(tmp_path / "nowhere.json")


# ----------------------------------------------------------------------------
# Shares: smooth weighted round-robin


def test_each_source_stays_within_one_row_of_its_share(tmp_path, token_files):
    mix = write_mix(
        tmp_path,
        {
            "sources": {"a": "x", "b": "y"},
            "weights": {"a": 0.3, "b": 0.7},
            "schedule": [{"step": 100, "weights": {"a": 0.6, "b": 0.4}}],
        },
    )
    stream = mixed_stream(mix, token_files, batch_size=10)  # one step per batch of 10 rows
    counts = {"a": 0, "b": 0}
    for n_rows in range(10, 1001, 10):
        for source in sources_of(stream.next_batch()[0]):
            counts[source] += 1
        for source, share in {"a": 0.3, "b": 0.7}.items():
            assert abs(counts[source] - share * n_rows) < 1, (n_rows, counts)
    assert counts == {"a": 300, "b": 700}
    assert stream.position == counts
    after = dict(counts)
    for _ in range(100):  # steps 100..199: the new weights
        for source in sources_of(stream.next_batch()[0]):
            after[source] += 1
    assert abs(after["a"] - counts["a"] - 600) <= 1 and abs(after["b"] - counts["b"] - 400) <= 1


def test_no_source_gets_ahead_of_its_share_whatever_the_weights():
    """The credits sum to 0 and stay above -1 (a source is never a row ahead), and below n - 1."""
    rng = random.Random(0)
    for _ in range(200):
        names = [f"s{i}" for i in range(rng.randint(2, 6))]
        credit = dict.fromkeys(names, 0.0)
        for _ in range(5):  # weights that change every few rows, as a ramp does
            raw = [rng.random() ** 3 for _ in names]
            weights = {s: w / sum(raw) for s, w in zip(names, raw)}
            picks, credit = assign_rows(weights, credit, rng.randint(1, 40))
            assert set(picks) <= set(names)
            assert all(-1 < c < len(names) - 1 for c in credit.values()), credit
            assert sum(credit.values()) == pytest.approx(0, abs=1e-9)


def test_ties_go_to_the_first_source():
    picks, _ = assign_rows({"a": 0.5, "b": 0.5}, {"a": 0.0, "b": 0.0}, 4)
    assert picks == ["a", "b", "a", "b"]


# ----------------------------------------------------------------------------
# The rows: what each source's TokenStream says, on any layout, across a resume

RAMPED = {
    "sources": {"a": "x", "b": "y", "c": "z"},
    "weights": {"a": 0.5, "b": 0.3, "c": 0.2},
    "schedule": [{"step": 2, "weights": {"a": 0.1, "b": 0.2, "c": 0.7}, "ramp": 3}],
}


def test_each_source_reads_its_own_windows_in_order(tmp_path, token_files):
    mix = write_mix(tmp_path, RAMPED)
    stream = mixed_stream(mix, token_files, batch_size=6, order_seeds={"b": 7})  # b in a shuffled order
    seen = {"a": [], "b": [], "c": []}
    for _ in range(20):
        x, y = stream.next_batch()
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (6, T)
        assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
        for source, row_x, row_y in zip(sources_of(x), x, y):
            start = int(row_x[0]) % SOURCE_TOKENS
            assert start % T == 0 and int(row_y[-1]) % SOURCE_TOKENS == start + T  # a whole window of T + 1
            seen[source].append(start // T)
    for source, windows in seen.items():
        assert windows == [stream.streams[source].window(row) for row in range(len(windows))]
        assert stream.position[source] == len(windows)
    assert stream.mix_tokens() == {s: len(w) * T for s, w in seen.items()}


def rows_read(streams, n_calls):
    """The group's rows of n_calls micro-batches, in order: each rank's rows after the last's, call by call."""
    return torch.cat([torch.cat([s.next_batch()[0] for s in streams]) for _ in range(n_calls)])


def test_any_layout_with_the_same_micro_batch_reads_the_same_rows(tmp_path, token_files):
    mix = write_mix(tmp_path, RAMPED)
    one_rank = mixed_stream(mix, token_files, batch_size=8, accumulation_steps=2)
    two_ranks = [mixed_stream(mix, token_files, 4, rank, 2, accumulation_steps=2) for rank in range(2)]
    assert torch.equal(rows_read([one_rank], 16), rows_read(two_ranks, 16))


def test_any_layout_with_the_same_global_batch_reads_the_same_rows(tmp_path, token_files):
    """dp 1 with 2 micro-batches of 8 against dp 2 with one of 8 each: the weights follow the step alike."""
    mix = write_mix(tmp_path, RAMPED)
    accumulating = mixed_stream(mix, token_files, batch_size=8, accumulation_steps=2)
    two_ranks = [mixed_stream(mix, token_files, 8, rank, 2) for rank in range(2)]
    assert torch.equal(rows_read([accumulating], 16), rows_read(two_ranks, 8))


def test_resume_reads_the_same_batches(tmp_path, token_files):
    mix = write_mix(tmp_path, RAMPED)
    stream = mixed_stream(mix, token_files, batch_size=5, accumulation_steps=2)
    for _ in range(7):
        stream.next_batch()
    state = stream.state_dict()
    assert json.loads(json.dumps(state)) == state  # plain numbers: torch.save needs no pickled classes
    expected = [stream.next_batch() for _ in range(10)]
    resumed = mixed_stream(mix, token_files, batch_size=5, accumulation_steps=2)
    resumed.load_state_dict(state)
    for x, y in expected:
        x2, y2 = resumed.next_batch()
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_position_zero_reads_every_source_and_the_schedule_from_the_start(tmp_path, token_files):
    mix = write_mix(tmp_path, RAMPED)
    fresh = mixed_stream(mix, token_files, batch_size=5)
    expected = [fresh.next_batch()[0] for _ in range(8)]
    stream = mixed_stream(mix, token_files, batch_size=5)
    for _ in range(11):
        stream.next_batch()
    stream.load_state_dict({"position": 0})  # what --resume_without data_position passes
    assert all(torch.equal(x, stream.next_batch()[0]) for x in expected)


def test_a_single_streams_position_is_refused(tmp_path, token_files):
    stream = mixed_stream(write_mix(tmp_path, RAMPED), token_files, batch_size=5)
    with pytest.raises(ValueError, match="single stream's position.*--resume_without data_position"):
        stream.load_state_dict({"position": 40})


def test_the_position_setter_moves_rows_only(tmp_path, token_files):
    mix = write_mix(tmp_path, RAMPED)
    stream = mixed_stream(mix, token_files, batch_size=5)
    for _ in range(3):
        stream.next_batch()
    restored = stream.state_dict()
    skipped = {s: n + 100 for s, n in stream.position.items()}
    stream.position = skipped  # the runbook's skip after a rollback
    assert stream.position == skipped
    assert stream.state_dict() == {**restored, "rows": skipped}  # the step and the credits stay
    x, _ = stream.next_batch()
    unskipped = mixed_stream(mix, token_files, batch_size=5)
    unskipped.load_state_dict(restored)
    x_unskipped, _ = unskipped.next_batch()
    assert sources_of(x) == sources_of(x_unskipped)  # the same assignment, from rows 100 further on
    assert torch.equal(x, x_unskipped + 100 * T)  # lanes 1, no shuffle: row n is window n, tokens n*T ...
    with pytest.raises(ValueError, match="position names d, not sources of the mix"):
        stream.position = {"d": 3}


def test_a_changed_mix_keeps_what_it_knows(tmp_path, token_files):
    old = write_mix(tmp_path, {"sources": {"a": "x", "c": "z"}, "weights": {"a": 1, "c": 1}}, "old.json")
    stream = mixed_stream(old, token_files, batch_size=5)
    for _ in range(3):
        stream.next_batch()
    state = stream.state_dict()
    new = write_mix(tmp_path, {"sources": {"a": "x", "b": "y"}, "weights": {"a": 1, "b": 1}}, "new.json")
    continued = mixed_stream(new, token_files, batch_size=5)
    continued.load_state_dict(state)
    assert continued.state_dict() == {
        "rows_assigned": 15,
        "rows": {"a": state["rows"]["a"], "b": 0},  # c is forgotten, b starts at its first row
        "credit": {"a": state["credit"]["a"], "b": 0.0},
    }


def test_the_streams_must_be_the_mix_sources(tmp_path, token_files):
    mix = write_mix(tmp_path, RAMPED)
    streams = {name: TokenStream(token_files[name], np.uint16, 4, T) for name in ("a", "b")}
    with pytest.raises(ValueError, match="sources are a, b, c, but streams were opened for a, b"):
        MixedStream(mix, streams, 4)


# ----------------------------------------------------------------------------
# What changed, for the start-up print; each source's own data folder


def test_weight_changes_in_words(tmp_path):
    old = write_mix(
        tmp_path,
        {
            "sources": {"prose": "shakespeare", "code": "stdlib"},
            "weights": {"prose": 0.3, "code": 0.7},
            "schedule": [{"step": 1000, "weights": {"prose": 0.6, "code": 0.4}, "ramp": 200}],
        },
        "old.json",
    ).as_dict()
    new = write_mix(
        tmp_path,
        {
            "sources": {"prose": "shakespeare", "code": "stdlib", "web": "web/*.jsonl"},
            "weights": {"prose": 1, "code": 1, "web": 0},
        },
        "new.json",
    ).as_dict()
    assert weight_changes(old, new) == [
        "source added: web (web/*.jsonl)",
        "weights: prose 0.3 -> 0.5, code 0.7 -> 0.5",
        "schedule: step 1000: prose 0.6, code 0.4 over 200 steps -> none",
    ]
    assert weight_changes(new, new) == []
    assert weight_changes(None, old) == ["mix: none -> prose (shakespeare), code (stdlib)"]
    assert weight_changes(new, old)[0] == "source dropped: web (web/*.jsonl)"

    # two runs' data (run.json's "data"): a mix against a mix, a source, or the other way round
    stdlib = {"source": "stdlib", "source_sha256": "a" * 64, "tokenizer": "byte"}
    shakespeare = {"source": "shakespeare", "source_sha256": "b" * 64, "tokenizer": "byte"}
    assert data_changes({"mix": old}, {"mix": new}) == weight_changes(old, new)
    assert data_changes(stdlib, {"mix": old}) == ["mix: none -> prose (shakespeare), code (stdlib)"]
    assert data_changes({"mix": old}, stdlib) == ["mix: prose, code -> none; source: stdlib"]
    assert data_changes(stdlib, shakespeare) == ["source: stdlib -> shakespeare"]
    assert data_changes(stdlib, {**stdlib, "val_fraction": 0.2}) == []  # the same corpus


def test_each_source_is_prepared_into_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prose.txt").write_text("to be or not to be\n" * 50)
    (tmp_path / "code.txt").write_text("def f(x):\n    return x\n" * 50)
    mix = write_mix(
        tmp_path, {"sources": {"prose": "prose.txt", "code": "code.txt"}, "weights": {"prose": 1, "code": 1}}
    )
    prepared = prepare_sources(mix, DataConfig(workers=1))
    assert {name: data_dir for name, (data_dir, _) in prepared.items()} == {
        "prose": "data/prose_txt-byte",
        "code": "data/code_txt-byte",
    }
    assert prepared["prose"][1]["train_tokens"] + prepared["prose"][1]["val_tokens"] == 19 * 50 + 1  # + end-of-text
