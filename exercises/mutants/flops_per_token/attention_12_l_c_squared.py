# wrong: attention counted as 12 L C^2, the projections' shape, where it grows with the context T
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
return 6 * (parameters_on_rank(gpt_config) - T * C) + 12 * L * C * C
