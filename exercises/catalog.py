"""The exercises: each is a function body of the project, between two marker lines,

    # exercise NAME: begin
    ...
    # exercise NAME: end

and the project's own tests that grade it. In the chapter's order; make.py stubs the bodies,
grade.py runs the tests. A teacher adds hidden tests by listing their node ids here.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    name: str
    file: str  # where its marked body lives, from the project's root
    what: str  # one line: what to write
    tests: tuple  # pytest node ids, from the project's root


EXERCISES = [
    Exercise("next_batch", "data.py", "TokenStream.next_batch: the next sequential windows of this rank's share",
             ("tests/test_data.py::test_token_stream_walks_without_gaps_or_overlap",
              "tests/test_data.py::test_token_stream_shards_by_rank_and_resumes")),
    Exercise("init", "model.py", "GPT._init_weights: the width-scaled init, residual projections scaled by depth",
             ("tests/test_model.py::test_init_std_follows_the_stated_rule",
              "tests/test_model.py::test_initial_loss_is_uniform_guessing")),
    Exercise("clm_loss", "model.py", "clm_loss: the mean next-token cross-entropy, in fp32",
             ("tests/test_model.py::test_initial_loss_is_uniform_guessing",
              "tests/test_train.py::test_accumulation_equals_one_big_batch")),
    Exercise("lr_at", "train.py", "lr_at: linear warmup, then cosine down to min_lr",
             ("tests/test_train.py::test_lr_schedule_warmup_then_cosine",)),
    Exercise("clip_gradients", "train.py", "clip_gradients: one factor for all gradients, from the global norm",
             ("tests/test_train.py::test_clipping_bounds_the_global_norm",)),
    Exercise("check_step", "monitor.py", "HealthMonitor.check_step: NaN, loss spike over the median, grad-norm z-score",
             ("tests/test_monitor.py::test_spike_is_judged_against_the_recent_median",
              "tests/test_monitor.py::test_non_finite_is_always_an_incident",
              "tests/test_monitor.py::test_grad_norm_z_warns_and_marks_the_next_checkpoint_unhealthy")),
    Exercise("dp_average", "parallel.py", "DataParallel.finish: wait for the all-reduces and write back the average",
             ("tests/test_data_parallel.py::test_bucketed_and_naive_average_to_the_same_gradients",
              "tests/test_data_parallel.py::test_layout_matches_single_process[dp2]")),
    Exercise("one_f_one_b", "pipeline.py", "one_f_one_b: one stage's operations under 1F1B",
             ("tests/test_pipeline.py::test_logical_bubble_is_the_textbook_formula",
              "tests/test_pipeline.py::test_stored_activations_gpipe_m_1f1b_at_most_p",
              "tests/test_pipeline.py::test_pipeline_equals_single_device")),
    Exercise("flops_per_token", "cost.py", "flops_per_token: 6 N plus attention's 12 L C T",
             ("tests/test_cost.py::test_parameters_and_flops_follow_the_model",
              "tests/test_cost.py::test_gpt3_175b_on_300b_tokens_is_3_14e23_flops")),
]
BY_NAME = {e.name: e for e in EXERCISES}


def begin(name):
    return f"# exercise {name}: begin"


def end(name):
    return f"# exercise {name}: end"


def stub_line(name):
    return f'raise NotImplementedError("exercise {name}: write this body (see exercises/README.md)")'


def body(source, name):
    """(lines before, the body's lines, lines after) of a file's text around an exercise's markers."""
    lines = source.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.strip() == begin(name))
    last = next(i for i, line in enumerate(lines) if line.strip() == end(name))
    return lines[: first + 1], lines[first + 1 : last], lines[last:]


def replace_body(source, name, new_body):
    """The file's text with the exercise's body replaced by new_body (a list of lines, indented)."""
    before, _, after = body(source, name)
    return "".join(before + new_body + after)


def indent_of(source, name):
    before, _, _ = body(source, name)
    marker = before[-1]
    return marker[: len(marker) - len(marker.lstrip())]
