# wrong: 6 N over the blocks' matrices only (12 L C^2), leaving out the head's V x C matmul
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
return 6 * 12 * L * C**2 + 12 * L * C * T
