# wrong: attention counted as 6 L C T: one of its two matmuls (q k^T, then the weighted sum of v) forgotten
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
return 6 * (parameters_on_rank(gpt_config) - T * C) + 6 * L * C * T
