# wrong: attention counted as 6 L C T: one of its two matmuls (q k^T, then the weighted sum of v) forgotten
return 6 * (parameters_on_rank(mc) - mc.block_size * mc.n_embd) + 6 * mc.n_layer * mc.n_embd * mc.block_size
