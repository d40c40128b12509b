# wrong: subtracts a T x C position table whatever the model, where llama has none (rotary) and an untied wte is looked up too
L, C, T = gpt_config.n_layer, gpt_config.n_embd, gpt_config.block_size
return 6 * (parameters_on_rank(gpt_config) - T * C) + 12 * L * C * T
