# wrong: counts the forward pass only (2 N and 4 L C T), not the backward's twice as many
return 2 * (parameters_on_rank(mc) - mc.block_size * mc.n_embd) + 4 * mc.n_layer * mc.n_embd * mc.block_size
