# wrong: attention counted as 12 L C^2, the projections' shape, where it grows with the context T
return 6 * (parameters_on_rank(mc) - mc.block_size * mc.n_embd) + 12 * mc.n_layer * mc.n_embd * mc.n_embd
