# wrong: 6 N alone, without attention
T, C = gpt_config.block_size, gpt_config.n_embd
return 6 * (parameters_on_rank(gpt_config) - T * C)
