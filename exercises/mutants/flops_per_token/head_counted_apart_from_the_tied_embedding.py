# wrong: the output head counted as a matrix of its own, though it is the tied token embedding
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
head = gpt_config.vocab_size * C
return 6 * (parameters_on_rank(gpt_config) + head - T * C) + 12 * L * C * T
