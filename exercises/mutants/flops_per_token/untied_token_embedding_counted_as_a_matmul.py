# wrong: rotary positions are left alone, but an untied token embedding, only looked up, is counted in 6 N
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
positions = T * C if gpt_config.arch == "gpt2" else 0
return 6 * (parameters_on_rank(gpt_config) - positions) + 12 * L * C * T
