"""The closed forms of a run's costs, each a function of the model's shape and the layout: the parameters a rank
holds, the FLOPs per token, the bytes each rank sends per step in each dimension, and the bytes of state and of
activations on the fullest device. The planner (planner.py), the account a run prints (cost.py, reporting.py) and
the tests hold them against what the code does: the model's own count, comm_count's counted bytes, autograd's kept
tensors, the optimizer's state.
"""

import ast
import operator
import re
from dataclasses import dataclass

from parallel.grid import Layout
from parallel.pipeline import stage_layers

# ----------------------------------------------------------------------------
# A closed form: its arithmetic, computed as written

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
OPERATORS[ast.Div] = operator.truediv


def computed(arithmetic, **values):
    """The value of arithmetic as it is written: names of values, numbers, + - * / // and parentheses. A formula
    printed beside a measurement is the expression that computed the number, so the two cannot drift apart."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"{ast.unparse(node)!r} in {arithmetic!r} is not arithmetic of named values")

    return value(ast.parse(arithmetic, mode="eval").body)


def closed_form(terms, **values):
    """(value, formula) of a sum of terms [(arithmetic, what it counts)], each computed as written, the formula
    naming the values its terms use: 'A * 4 * P (gradients reduce-scattered) + 4 * P (weights gathered), A=2
    P=1,234'. No terms: (0, 'none: a group of 1')."""
    if not terms:
        return 0, "none: a group of 1"
    used = {name for arithmetic, _ in terms for name in re.findall(r"[A-Za-z_]\w*", arithmetic)}
    named = " ".join(f"{name}={value:,}" for name, value in values.items() if name in used)
    return sum(computed(arithmetic, **values) for arithmetic, _ in terms), (
        " + ".join(f"{arithmetic} ({what})" for arithmetic, what in terms) + f", {named}"
    )


# ----------------------------------------------------------------------------
# The model: parameters and FLOPs


def norm_parameters(gpt_config):
    """One norm's parameters: C weights, and C biases under GPT-2's LayerNorm; none under arms.py's --norm none."""
    if gpt_config.norm == "none":
        return 0
    return gpt_config.n_embd * (2 if gpt_config.norm == "layernorm" and gpt_config.bias else 1)


def final_norm(gpt_config):
    """Whether the model ends on a norm of its own: Pre-LN's last norm, which arms.py's Post-LN has not."""
    return getattr(gpt_config, "norm_position", "pre") == "pre"  # a GPTConfig: Pre-LN; an ArmsConfig says


def parameters_on_rank(gpt_config, layout=Layout(), stage=0):
    """Closed form of the parameters one rank of the layout holds (stage `stage` of pp, a 1/tp slice of its
    matrices); with the defaults, the whole model's count, GPT(gpt_config).num_params().

    A block's matrices are cut by tp, its norms stay whole on every TP rank: attention's q (C^2), k and v
    (C x kv each, kv = C kv_heads / n_head: C^2 each without GQA) and output (C^2); the MLP's two matrices of
    C x hidden (GELU, hidden 4 C: 8 C^2 in all) or three (SwiGLU, llama). So GPT-2's block holds 12 C^2. The
    first stage adds the embedding (its V/tp rows, the vocabulary padded to a multiple of tp) and the learned
    positions (gpt2); the last stage the final norm, and the head's matrix where it is not the first stage's
    embedding itself: a copy of the tied one on a later stage, or an untied head of its own."""
    C, V, H = gpt_config.n_embd, gpt_config.vocab_size, gpt_config.hidden
    kv, tp, pp = gpt_config.kv_width, layout.tp, layout.pp
    mlp_matrices = 3 if gpt_config.arch == "llama" else 2
    norm = norm_parameters(gpt_config)
    matrices = C * (C + 2 * kv) + C * C + mlp_matrices * C * H
    column_biases = (C + 2 * kv if gpt_config.bias or gpt_config.qkv_bias else 0) + (
        (mlp_matrices - 1) * H if gpt_config.bias else 0
    )  # cut by tp with their matrices; the row-parallel ones (attention out, MLP down) stay whole
    block = matrices // tp + 2 * norm + column_biases // tp + (2 * C if gpt_config.bias else 0)
    first_block, end_block = stage_layers(gpt_config.n_layer, pp)[stage]
    embedding = -(-V // tp) * C
    n = (end_block - first_block) * block
    if stage == 0:
        n += embedding + (gpt_config.block_size * C if gpt_config.arch == "gpt2" else 0)  # learned positions
    if stage == pp - 1:
        head = embedding if pp > 1 or not gpt_config.tie_embeddings else 0
        n += (norm if final_norm(gpt_config) else 0) + head
    return n


def whole_parameters_on_stage(gpt_config, pp=1, stage=0):
    """The parameters every TP rank holds whole on a pipeline stage: its blocks' norms and row-parallel biases, the
    learned positions on the first stage, the final norm on the last (parameters_on_rank's uncut part). Under
    sequence parallelism each TP rank's gradient of them comes from its T/tp positions, so they are summed."""
    C = gpt_config.n_embd
    norm = norm_parameters(gpt_config)
    first_block, end_block = stage_layers(gpt_config.n_layer, pp)[stage]
    n = (end_block - first_block) * (2 * norm + (2 * C if gpt_config.bias else 0))
    n += gpt_config.block_size * C if stage == 0 and gpt_config.arch == "gpt2" else 0
    return n + (norm if stage == pp - 1 and final_norm(gpt_config) else 0)


def lookup_parameters(gpt_config):
    """The parameters only looked up, never multiplied: the learned positions (gpt2: T x C; rotary ones have none),
    and the token embedding where the head is a matrix of its own (tied, the same matrix is the head's matmul)."""
    positions = gpt_config.block_size * gpt_config.n_embd if gpt_config.arch == "gpt2" else 0
    return positions + (0 if gpt_config.tie_embeddings else gpt_config.vocab_size * gpt_config.n_embd)


def fullest_rank_parameters(gpt_config, layout):
    """The parameters of the rank that holds the most (the first stage, with the embedding and positions)."""
    return max(parameters_on_rank(gpt_config, layout, s) for s in range(layout.pp))


def flops_per_token(gpt_config):
    """Training FLOPs per token: 6 N for the weight matmuls (2 N forward, 4 N backward), plus 12 L C T
    for attention's q k^T and its weighted sum of v (2 T C each per layer forward, times 3 with
    backward), counted over the full T x T square as the PaLM paper does. A position lookup does no matmul."""
    # exercise flops_per_token: begin
    L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
    return 6 * (parameters_on_rank(gpt_config) - lookup_parameters(gpt_config)) + 12 * L * C * T
    # exercise flops_per_token: end


def comm_bytes_per_step(gpt_config, layout, *, stage, batch_size, accumulation, compute_bytes):
    """Closed form of the bytes a rank of the layout's pipeline stage `stage` hands to each dimension's
    communication in one optimizer step (what comm_count.counted counts), with the step's
    formula: {dimension: (bytes, formula)}.

    Each dimension's bytes are a sum of terms, each an arithmetic of named values computed as written
    (closed_form): B = batch_size rows per micro-step (all of a pipeline's micro-batches together), A micro-steps
    of accumulation, T = the positions of a sequence a rank holds (block_size / cp), C = n_embd, L = the stage's
    blocks, c = compute_bytes, r = 1 under recomputation, m = a pipeline's micro-batches, n = its sends a
    micro-step, s = tp under sequence parallelism (else 1), P = the parameters the rank holds, W = those it holds
    whole, Vtp = the vocabulary rows a TP rank holds, kv = its key/value width. The
    activations cross in fp32, except the row-parallel matmul outputs, which are in the
    compute dtype (compute_bytes: 2 under bf16 or fp16 autocast).
      tp: per block, 2 all-reduces forward (after attention and after the MLP) and 2 backward
          (before them), every micro-step: at every layer. Recomputation adds the attention's one
          again in backward (the MLP's output feeds no tensor backward keeps, and torch's checkpoint
          stops rebuilding once backward has what it needs). Plus the embedding's forward on the
          first stage, the head's backward and the loss's 3 (B, T) reductions (a max, two sums) on
          the last. Under sequence parallelism each all-reduce becomes an all-gather and a reduce-scatter of the
          same (B, T, C) buffer, each counted whole (a ring moves half an all-reduce's bytes for each): per block,
          forward an all-gather (fp32) before each column-parallel layer and a reduce-scatter (compute dtype) after
          each row-parallel one, backward the reverse; recomputation gathers attention's and the MLP's inputs and
          scatters attention's output again. The embedding's reduce-scatter and the head's all-gather (fp32) go both
          ways, and the whole parameters' gradients (norms, positions, row-parallel biases) are summed, fp32, as
          each backward makes them: once per micro-batch of a pipeline (micro_batches), once per micro-step else.
      pp: per micro-step, the activation (B, T, C) to the next stage and its gradient back to
          the one before ((B, T/tp, C) under sequence parallelism): between stages only. Interleaved over v
          chunks a rank (virtual_stages), each chunk sends both, less the model's first and last chunks: 2 v
          on the ranks between, 2 v - 1 on the ends. Plus, once per step, the tied embedding's gradient between
          the first and last stages.
      cp: per block, its keys and values (2 B T kv/tp, compute dtype) passed around the ring cp - 1 times forward
          (again under recomputation) and their gradient cp - 1 times back; and the gradient of every parameter
          the rank holds averaged over the group as each backward makes it (fp32, micro_batches per micro-step).
      dp: once per step, the gradient of every parameter the rank holds, fp32; under ZeRO (zero 1, 2) a
          reduce-scatter of it (ZeRO-2: every micro-step) and an all-gather of the updated weights; under
          FSDP2 (zero 3) its reduce-scatter alone is counted (its all-gathers carry weights, not gradients).
    """
    dp, tp, pp, cp, zero = layout.dp, layout.tp, layout.pp, layout.cp, layout.zero_stage
    r, sp, m, v = int(layout.recompute), layout.sequence_parallel, layout.pipeline_micro_batches, layout.virtual_stages
    B, T, C, A, c = batch_size, gpt_config.block_size // cp, gpt_config.n_embd, accumulation, compute_bytes
    first_block, end_block = stage_layers(gpt_config.n_layer, pp)[stage]
    L, first, last = end_block - first_block, stage == 0, stage == pp - 1
    P = parameters_on_rank(gpt_config, layout, stage)  # the parameters this rank holds, whose gradients it sends
    tp_terms = pp_terms = dp_terms = cp_terms = []  # [(arithmetic, what it counts)]: none, a group of 1
    if tp > 1 and not sp:
        tp_terms = [("A * L * B * T * C * ((2 + r) * c + 2 * 4)", "all-reduces, two each way at every layer")]
        tp_terms += [("A * B * T * C * 4", "the embedding's")] if first else []
        tp_terms += [("A * B * T * C * 4", "the head's"), ("A * 3 * B * T * 4", "the loss's sums")] if last else []
    if tp > 1 and sp:
        tp_terms = [("A * L * B * T * C * ((4 + r) * c + (4 + 2 * r) * 4)", "gathers and scatters at every layer")]
        tp_terms += [("A * B * T * C * 8", "the embedding's, both ways")] if first else []
        tp_terms += (
            [("A * B * T * C * 8", "the head's, both ways"), ("A * 3 * B * T * 4", "the loss's sums")] if last else []
        )
        tp_terms += [("A * m * W * 4", "the whole parameters' gradients summed")]
    # pp: sends a micro-step, forward from each chunk but the model's last, backward from each but its first
    n, s = 2 * v - first - last, tp if sp else 1
    if pp > 1:
        sent = "activations forward, gradients back" if n >= 2 else "activations on" if first else "gradients back"
        pp_terms = [("A * n * B * T * C // s * 4", sent)]
        if (first or last) and gpt_config.tie_embeddings:  # its two copies
            pp_terms += [("Vtp * C * 4", "the tied embedding's gradient")]
    if dp > 1 and zero in (1, 2):  # ours: reduce-scattered (ZeRO-2: every micro-step), then the weights all-gathered
        dp_terms = [
            ("A * 4 * P" if zero == 2 else "4 * P", "gradients reduce-scattered"),
            ("4 * P", "weights gathered"),
        ]
    elif dp > 1:  # FSDP2 (stage 3) counts its reduce-scatters only: its all-gathers carry weights
        dp_terms = [("4 * P", "gradients averaged, once per step")]
    if cp > 1:
        cp_terms = [
            ("A * L * (cp - 1) * (2 + r) * 2 * B * T * kv * c", "keys and values around the ring"),
            ("A * m * 4 * P", "the gradients averaged over the group"),
        ]
    values = dict(A=A, L=L, B=B, T=T, C=C, c=c, r=r, m=m, n=n, s=s, cp=cp, P=P, kv=gpt_config.kv_width // tp)
    values.update(W=whole_parameters_on_stage(gpt_config, pp, stage), Vtp=-(-gpt_config.vocab_size // tp))
    return {
        d: closed_form(terms, **values)
        for d, terms in (("dp", dp_terms), ("tp", tp_terms), ("pp", pp_terms), ("cp", cp_terms))
    }


def busiest_stage_comm_bytes(gpt_config, layout, *, batch_size, accumulation, compute_bytes):
    """{dimension: (bytes, formula)} per step, in closed form, of the stage that sends the most in it
    (what train.py logs as comm_bytes_* and prints beside the counts)."""
    per_stage = [
        comm_bytes_per_step(
            gpt_config,
            layout,
            stage=stage,
            batch_size=batch_size,
            accumulation=accumulation,
            compute_bytes=compute_bytes,
        )
        for stage in range(layout.pp)
    ]
    return {
        d: max((stage[d] for stage in per_stage), key=lambda closed_form: closed_form[0])
        for d in ("dp", "tp", "pp", "cp")
    }


# ----------------------------------------------------------------------------
# A rank's memory: the training state and the activations


# fp32 weights (4), gradients (4) and AdamW's two moments (8), per parameter a rank holds, by ZeRO's stage
STATE_BYTES = {0: "4 + 4 + 8", 1: "4 + 4 + 8/dp", 2: "4 + 12/dp", 3: "16/dp"}


def state_bytes_per_parameter(dp=1, zero=0):
    """Bytes of training state per parameter a rank holds: fp32 weights (4), gradients (4) and AdamW's two
    moments (8). ZeRO (zero.py; Rajbhandari et al. 2020) shares out over the dp ranks, stage 1: the moments,
    4 + 4 + 8/dp; stage 2: the gradients too, 4 + 12/dp; stage 3 (FSDP): the weights too, 16/dp. (With bf16
    weights and gradients beside fp32 master weights, the paper's case, stage 1 leaves 4 + 12/dp of 16.)"""
    return computed(STATE_BYTES[zero], dp=dp)


def state_bytes_formula(dp=1, zero=0):
    """state_bytes_per_parameter as its formula, for the printed comparisons: '4 + 4 + 8/2 = 12 B'."""
    return f"{STATE_BYTES[zero].replace('dp', str(dp))} = {state_bytes_per_parameter(dp, zero):g} B"


def fullest_rank_state_bytes(gpt_config, layout):
    """Closed form of the training state on the rank of the layout that holds the most (train.py prints it beside
    monitor.state_bytes at the first update)."""
    return state_bytes_per_parameter(layout.dp, layout.zero_stage) * fullest_rank_parameters(gpt_config, layout)


@dataclass(frozen=True)
class Memory:
    """Bytes on the fullest device of a layout (memory_per_gpu)."""

    state: float  # weights, gradients and AdamW's two moments: 16 B per parameter held, less what ZeRO shares out
    activations: float  # what backward keeps: the micro-batches in flight, plus the logits of one

    @property
    def total(self):
        return self.state + self.activations


def memory_per_gpu(gpt_config, layout, micro_batch_rows, in_flight, activation_bytes=2, fused_ring=True):
    """Bytes on the fullest device of a layout, as a Memory.

    state: 16 B per parameter held (the stage with the embedding holds the most), less what ZeRO's
    stage (the layout's zero_stage) shares out over the dp ranks (state_bytes_per_parameter).
    activations: per layer and micro-batch of b rows, s b h (10 + 24/t) bytes at 16 bits under TP
    of t without sequence parallelism (Korthikanti et al. 2022, whose 5 a s / h more for the
    (s, s) attention scores a fused attention kernel never stores: model.py calls SDPA), or only
    the layer's input, 2 s b h, with full recomputation. Their 24 h is what TP cuts: q, k, v and
    attention's output (2 h each; k and v 2 kv each under GQA), and the MLP's hidden activations,
    GELU's input and output (2 x 2 H, H = 4 h) or SwiGLU's gate, up, SiLU(gate) and product (4 x 2 H),
    and under RoPE the rotated copies of q and k (2 h + 2 kv). Their 10 h is what TP leaves whole: the norms'
    inputs (4 h), dropout's masks (2 h), and the inputs of the column-parallel layers (4 h). Sequence
    parallelism cuts the first two by position, 4 h + 6 h/t; the gathered inputs stay whole, as autograd keeps
    them (Megatron gathers them again in backward to cut them too);
    times the stage's layers, times the micro-batches in flight (1F1B: p on the first stage, at most m;
    GPipe: all m), plus the logits of one. Context parallelism (cp) gives a rank s / cp positions of all of it,
    plus the K and V blocks the ring brings, kept for their backward: 4 kv (cp - 1) / tp a position, as a fused
    ring kernel keeps them (fused_ring). context_parallel.ring_attention, written to be read, rebuilds each block's
    scores in backward too, but autograd keeps every merge's running output and block output, fp32: 8 h (cp - 1) / tp
    bytes a position more on the ring's last rank, whose every step merges a whole block (fused_ring=False)."""
    tp, pp, cp, recompute, sequence_parallel = (
        layout.tp,
        layout.pp,
        layout.cp,
        layout.recompute,
        layout.sequence_parallel,
    )
    state = fullest_rank_state_bytes(gpt_config, layout)
    s, b, h = gpt_config.block_size // cp, micro_batch_rows, gpt_config.n_embd
    kv = gpt_config.kv_width
    llama = gpt_config.arch == "llama"
    mlp = (8 if llama else 4) * gpt_config.hidden
    rope = 2 * h + 2 * kv if llama else 0  # the rotated q and k: copies attention keeps beside q, k, v's own
    left_whole = 4 * h + 6 * h / tp if sequence_parallel else 10 * h
    cut_by_position = tp if sequence_parallel else 1  # a recomputed layer keeps its input: T/tp positions under SP
    ring = 4 * kv * (cp - 1)  # the K and V blocks received from the other cp - 1 ranks (their TP slice: / tp below)
    per_layer = (
        2 * s * b * h / cut_by_position
        if recompute
        else s * b * (left_whole + (4 * h + 4 * kv + mlp + rope + ring) / tp)
    )
    layers = max(end - first for first, end in stage_layers(gpt_config.n_layer, pp))
    # in the compute dtype, and the loss's fp32 copy
    logits = b * s * -(-gpt_config.vocab_size // tp) * (activation_bytes + 4)
    activations = in_flight * layers * per_layer * activation_bytes / 2 + logits
    if not (fused_ring or recompute):  # recomputation keeps a layer's input alone, ring and merges rebuilt
        activations += in_flight * layers * s * b * 8 * h * (cp - 1) / tp
    return Memory(state, activations)
