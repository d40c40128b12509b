# wrong: attention counted for one head, 12 L (C / H) T, where the H heads together span C
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
head_size = C // gpt_config.n_head
return 6 * (parameters_on_rank(gpt_config) - T * C) + 12 * L * head_size * T
