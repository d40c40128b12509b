# wrong: leaves out the token embedding as well (Kaplan's non-embedding N), but it is the head's matmul
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
embeddings = (T + gpt_config.vocab_size) * C
return 6 * (parameters_on_rank(gpt_config) - embeddings) + 12 * L * C * T
