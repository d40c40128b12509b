# wrong: 6 N alone, without attention
return 6 * (parameters_on_rank(mc) - mc.block_size * mc.n_embd)
