"""The exercises: each is one or more function bodies of the project, each between two marker lines,

    # exercise NAME: begin                 (an exercise of one body)
    # exercise NAME, WHERE: begin          (one body of an exercise of several, WHERE naming its function)
    ...
    # exercise NAME: end

and the project's own tests that grade it. In the chapter's order; make.py stubs the bodies,
grade.py runs the tests, check_graders.py proves the tests reject the wrong bodies kept in
mutants/. A teacher adds hidden tests by listing their node ids here.
"""

import os
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the project's root: its UserError
from errors import UserError  # noqa: E402

MUTANTS = os.path.join(HERE, "mutants")


@dataclass(frozen=True)
class Exercise:
    name: str
    file: str  # where its marked bodies live, from the project's root
    where: tuple  # the functions whose bodies are cut out, in file order: ("TokenStream.next_batch",)
    what: str  # one line: what to write
    needs: tuple  # exercises whose bodies its tests also run: write those first
    tests: tuple  # pytest node ids, from the project's root


EXERCISES = [
    Exercise(
        "next_batch",
        "data.py",
        ("TokenStream.next_batch",),
        "the next sequential windows of this rank's share",
        (),
        (
            "tests/test_data.py::test_token_stream_walks_without_gaps_or_overlap",
            "tests/test_data.py::test_token_stream_shards_by_rank_and_resumes",
            "tests/test_data.py::test_a_seeded_order_reads_the_same_windows_in_another_sequence",
        ),
    ),
    Exercise(
        "init",
        "model.py",
        ("GPT._init_weights",),
        "the width-scaled init, residual projections scaled by depth",
        (),
        (
            "tests/test_model.py::test_init_std_follows_the_stated_rule",
            "tests/test_model.py::test_initial_loss_is_uniform_guessing",
        ),
    ),
    Exercise(
        "attention",
        "machinery/job/arms.py",
        ("manual_causal_attention",),
        "softmax(q k^T / sqrt(head size) + causal mask) v, scores in fp32, dropout on the weights",
        (),
        (
            "tests/test_attention.py::test_equals_pytorch_attention_in_output_and_gradients",
            "tests/test_attention.py::test_earlier_positions_never_see_the_future",
            "tests/test_attention.py::test_the_first_position_reads_its_own_value",
            "tests/test_attention.py::test_one_new_query_sees_every_key_so_far",
            "tests/test_attention.py::test_each_output_averages_the_values_it_sees",
            "tests/test_attention.py::test_equal_keys_give_the_running_mean_of_the_values",
            "tests/test_attention.py::test_scores_are_scaled_by_one_over_root_head_size",
            "tests/test_attention.py::test_large_scores_neither_overflow_nor_lose_their_weights",
            "tests/test_attention.py::test_bf16_inputs_give_bf16_outputs_from_fp32_scores",
            "tests/test_attention.py::test_dropout_drops_weights_and_scales_the_kept_ones",
            "tests/test_attention.py::test_dropout_draws_each_weight_independently",
            "tests/test_attention.py::test_dropout_acts_on_the_weights_not_on_the_output",
        ),
    ),
    Exercise(
        "clm_loss",
        "model.py",
        ("clm_loss",),
        "the mean next-token cross-entropy, in fp32",
        (),
        (
            "tests/test_model.py::test_clm_loss_is_the_mean_negative_log_likelihood_over_all_positions",
            "tests/test_model.py::test_clm_loss_scores_a_perfect_predictor_zero",
            "tests/test_model.py::test_clm_loss_of_uniform_logits_is_ln_v",
            "tests/test_model.py::test_clm_loss_of_a_confidently_wrong_prediction_is_its_margin",
            "tests/test_model.py::test_clm_loss_counts_every_position_whatever_its_target",
            "tests/test_model.py::test_clm_loss_is_fp32_from_bf16_logits",
        ),
    ),
    Exercise(
        "lr_at",
        "train.py",
        ("lr_at",),
        "linear warmup, then cosine down to min_lr",
        (),
        ("tests/test_train.py::test_lr_schedule_warmup_then_cosine",),
    ),
    Exercise(
        "clip_gradients",
        "train.py",
        ("clip_gradients",),
        "one factor for all gradients, from the global norm",
        (),
        (
            "tests/test_train.py::test_clipping_bounds_the_global_norm",
            "tests/test_train.py::test_clipping_leaves_gradients_within_bounds_alone",
            "tests/test_train.py::test_clipping_uses_the_global_norm_it_is_given",
        ),
    ),
    Exercise(
        "check_step",
        "machinery/health/incidents.py",
        ("HealthMonitor.check_step",),
        "NaN, loss spike over the median, grad-norm z-score",
        (),
        (
            "tests/test_monitor.py::test_spike_is_judged_against_the_recent_median",
            "tests/test_monitor.py::test_a_loss_exactly_at_the_spike_bound_is_no_spike",
            "tests/test_monitor.py::test_spikes_and_warnings_stay_out_of_the_baselines",
            "tests/test_monitor.py::test_non_finite_is_always_an_incident",
            "tests/test_monitor.py::test_grad_norm_z_is_the_distance_from_the_healthy_mean_in_stds",
            "tests/test_monitor.py::test_a_grad_norm_exactly_at_the_z_bound_does_not_warn",
            "tests/test_monitor.py::test_a_zero_threshold_turns_the_z_warning_off",
            "tests/test_monitor.py::test_z_waits_for_the_baseline_and_survives_a_constant_one",
            "tests/test_monitor.py::test_grad_norm_z_warns_and_marks_the_next_checkpoint_unhealthy",
        ),
    ),
    Exercise(
        "dp_average",
        "parallel/data_parallel.py",
        ("NaiveDataParallel.finish", "BucketedDataParallel.finish"),
        "wait for the all-reduces and write back the average",
        ("init", "clm_loss"),
        (
            "tests/test_data_parallel.py::test_finish_leaves_the_group_average_on_every_step",
            "tests/test_data_parallel.py::test_bucketed_and_naive_average_to_the_same_gradients",
        ),
    ),
    Exercise(
        "tp_layers",
        "parallel/tensor_parallel.py",
        (
            "CopyToTensorParallel.forward",
            "CopyToTensorParallel.backward",
            "ReduceFromTensorParallel.forward",
            "ReduceFromTensorParallel.backward",
            "ColumnParallelLinear.forward",
            "RowParallelLinear.forward",
        ),
        "Megatron's f and g, and the column- and row-parallel Linear built on them",
        (),
        (
            "tests/test_tensor_parallel.py::test_f_is_the_identity_forward_and_sums_the_gradients_backward",
            "tests/test_tensor_parallel.py::test_g_sums_the_partial_results_forward_and_passes_the_gradient_back",
            "tests/test_tensor_parallel.py::test_column_parallel_linear_computes_this_ranks_output_features",
            "tests/test_tensor_parallel.py::test_row_parallel_linear_sums_partial_products_and_adds_its_bias_once",
            "tests/test_tensor_parallel.py::test_column_then_row_equals_the_single_device_mlp",
            "tests/test_tensor_parallel.py::test_column_then_row_communicates_one_all_reduce_each_way",
        ),
    ),
    Exercise(
        "one_f_one_b",
        "parallel/pipeline.py",
        ("one_f_one_b",),
        "one stage's operations under 1F1B",
        ("init", "clm_loss"),
        (
            "tests/test_pipeline.py::test_one_f_one_b_is_warmup_steady_cooldown",
            "tests/test_pipeline.py::test_one_f_one_b_runs_each_micro_batch_once_in_order",
            "tests/test_pipeline.py::test_logical_bubble_is_the_textbook_formula",
            "tests/test_pipeline.py::test_stored_activations_gpipe_m_1f1b_at_most_p",
            "tests/test_pipeline.py::test_pipeline_equals_single_device[m=4-p=2-1f1b]",
            "tests/test_pipeline.py::test_pipeline_equals_single_device[m=4-p=4-1f1b]",
        ),
    ),
    Exercise(
        "ring_attention",
        "parallel/context_parallel.py",
        ("merge_block",),
        "the online softmax: one block of keys' attention merged into the running output",
        (),
        (
            "tests/test_context_parallel.py::test_merging_blocks_gives_the_softmax_over_all_keys",
            "tests/test_context_parallel.py::test_merging_blocks_far_from_unit_scale_neither_overflows_nor_underflows",
            "tests/test_context_parallel.py::test_a_block_with_nothing_to_see_changes_nothing",
            "tests/test_context_parallel.py::test_gradients_through_the_merges_are_those_of_the_whole_softmax",
            "tests/test_context_parallel.py::test_ring_attention_equals_causal_attention_forward_and_backward",
        ),
    ),
    Exercise(
        "flops_per_token",
        "machinery/planning/closed_forms.py",
        ("flops_per_token",),
        "6 N plus attention's 12 L C T",
        (),
        (
            "tests/test_cost.py::test_gpt2_small_costs_nanogpts_855_mflops_per_token",
            "tests/test_cost.py::test_flops_per_token_counts_the_matmuls_of_forward_and_backward",
            "tests/test_cost.py::test_gpt3_175b_on_300b_tokens_is_3_14e23_flops",
        ),
    ),
    Exercise(
        "checkpoint",
        "machinery/components/checkpointer.py",
        ("Checkpointer.snapshot", "Checkpointer.restore"),
        "what a checkpoint holds, in single-device form, and the resume that puts each piece back",
        ("init", "clm_loss", "next_batch", "lr_at", "clip_gradients", "check_step", "flops_per_token"),
        (
            "tests/test_checkpoint_state.py::test_a_checkpoint_holds_every_piece_under_its_name",
            "tests/test_checkpoint_state.py::test_restore_returns_the_step_and_the_schedule_continues_there",
            "tests/test_checkpoint_state.py::test_restore_puts_back_the_weights",
            "tests/test_checkpoint_state.py::test_restore_puts_back_adamws_moments",
            "tests/test_checkpoint_state.py::test_restore_puts_back_the_data_position",
            "tests/test_checkpoint_state.py::test_restore_puts_back_every_random_generator",
            "tests/test_checkpoint_state.py::test_restore_puts_back_the_monitors_baselines",
            "tests/test_checkpoint_state.py::test_restore_puts_back_the_runbooks_state",
            "tests/test_checkpoint_state.py::test_restore_puts_back_the_loss_scaler",
            "tests/test_checkpoint_state.py::test_a_checkpoint_saved_without_loss_scaling_resumes_under_fp16",
            "tests/test_checkpoint_state.py::test_resume_without_a_piece_leaves_out_that_piece_only",
            "tests/test_checkpoint_state.py::test_resuming_again_without_the_schedule_restarts_it_at_the_new_resume",
            "tests/test_checkpoint_state.py::test_a_checkpoint_without_optimizer_state_resumes_under_reset_optimizer",
            "tests/test_checkpoint_state.py::test_a_resumed_run_takes_bitwise_the_steps_the_saved_run_took",
            "tests/test_checkpoint_state.py::test_two_pipeline_stages_save_the_single_device_form",
            "tests/test_checkpoint_state.py::test_two_pipeline_stages_restore_their_parts",
        ),
    ),
]
BY_NAME = {e.name: e for e in EXERCISES}


def in_needs_order(exercises):
    """The exercises with each one after those it needs; otherwise in the chapter's order."""
    placed, order = set(), []
    pending = list(exercises)
    while pending:
        ready = next((e for e in pending if all(n in placed or n not in BY_NAME for n in e.needs)), None)
        if ready is None:
            raise UserError(
                f"exercises {', '.join(e.name for e in pending)} need each other: break the cycle in catalog.py"
            )
        order.append(ready)
        placed.add(ready.name)
        pending.remove(ready)
    return order


def all_needs(exercise):
    """Every exercise this one's tests run, directly or through another's."""
    seen, todo = set(), list(exercise.needs)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += BY_NAME[name].needs
    return seen - {exercise.name}


# ----------------------------------------------------------------------------
# The marked bodies in the source


def marker(exercise, where, side):
    part = "" if len(exercise.where) == 1 else f", {where}"
    return f"# exercise {exercise.name}{part}: {side}"


def stub_line(name):
    return f'raise NotImplementedError("exercise {name}: write this body (see exercises/README.md)")'


def body(source, exercise, where, path=None):
    """(lines before, the body's lines, lines after) of a file's text around one marked body."""
    path = path or exercise.file
    lines = source.splitlines(keepends=True)
    found = {}
    for side in ("begin", "end"):
        wanted = marker(exercise, where, side)
        at = [i for i, line in enumerate(lines) if line.strip() == wanted]
        if not at:
            raise UserError(
                f"{path}: exercise {exercise.name}: the line `{wanted}` is missing; restore it "
                f"in {where}, at the {'start' if side == 'begin' else 'end'} of the body you write, "
                "indented like the body"
            )
        if len(at) > 1:
            raise UserError(
                f"{path}: exercise {exercise.name}: the line `{wanted}` appears "
                f"{len(at)} times (lines {', '.join(str(i + 1) for i in at)}); keep only the one "
                f"in {where}"
            )
        found[side] = at[0]
    if found["end"] < found["begin"]:
        raise UserError(
            f"{path}: exercise {exercise.name}: `{marker(exercise, where, 'end')}` (line "
            f"{found['end'] + 1}) comes before `{marker(exercise, where, 'begin')}` (line "
            f"{found['begin'] + 1}); the body of {where} goes between them"
        )
    return lines[: found["begin"] + 1], lines[found["begin"] + 1 : found["end"]], lines[found["end"] :]


def indent_of(source, exercise, where):
    before, _, _ = body(source, exercise, where)
    return before[-1][: len(before[-1]) - len(before[-1].lstrip())]


def replace_body(source, exercise, where, new_body):
    """The file's text with one body replaced by new_body: lines at indent 0, indented here like the markers."""
    before, _, after = body(source, exercise, where)
    indent = indent_of(source, exercise, where)
    return "".join(before + [indent + line if line.strip() else line for line in new_body] + after)


def stub(source, exercise):
    """The file's text with every body of the exercise replaced by the stub."""
    for where in exercise.where:
        source = replace_body(source, exercise, where, [stub_line(exercise.name) + "\n"])
    return source


def reference_bodies(root, exercise):
    """{where: the body's lines at indent 0} as the project at root has them."""
    with open(os.path.join(root, exercise.file)) as f:
        source = f.read()
    bodies = {}
    for where in exercise.where:
        indent = indent_of(source, exercise, where)
        bodies[where] = [line.removeprefix(indent) for line in body(source, exercise, where)[1]]
    return bodies


# ----------------------------------------------------------------------------
# Mutants: wrong bodies the graders must reject


@dataclass(frozen=True)
class Mutant:
    exercise: str
    path: str  # exercises/mutants/NAME/what_is_wrong.py
    wrong: str  # the file's first line, `# wrong: ...`, without its prefix
    where: str  # which body it replaces: `# in: WHERE` on its second line, for an exercise of several bodies
    lines: tuple  # the body, at indent 0


def read_mutant(exercise, path):
    with open(path) as f:
        lines = f.read().splitlines(keepends=True)
    if not lines or not lines[0].startswith("# wrong: "):
        raise UserError(f"{path}: the first line must be `# wrong: what this body gets wrong`")
    where, start = exercise.where[0], 1
    if len(lines) > 1 and lines[1].startswith("# in: "):
        where, start = lines[1].removeprefix("# in: ").strip(), 2
    if where not in exercise.where:
        raise UserError(f"{path}: `# in: {where}`: exercise {exercise.name} has the bodies {', '.join(exercise.where)}")
    if len(exercise.where) > 1 and start == 1:
        raise UserError(
            f"{path}: exercise {exercise.name} has several bodies: name the one this replaces on "
            f"the second line, `# in: WHERE`, one of {', '.join(exercise.where)}"
        )
    return Mutant(exercise.name, path, lines[0].removeprefix("# wrong: ").strip(), where, tuple(lines[start:]))


def mutants_of(exercise, mutants=MUTANTS):
    folder = os.path.join(mutants, exercise.name)
    if not os.path.isdir(folder):
        return []
    return [read_mutant(exercise, os.path.join(folder, f)) for f in sorted(os.listdir(folder)) if f.endswith(".py")]
