# wrong: 6 N over every parameter, the position table too, though a lookup does no matmul
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
return 6 * parameters_on_rank(gpt_config) + 12 * L * C * T
