# wrong: counts the forward pass only (2 N and 4 L C T), not the backward's twice as many
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
return 2 * (parameters_on_rank(gpt_config) - T * C) + 4 * L * C * T
