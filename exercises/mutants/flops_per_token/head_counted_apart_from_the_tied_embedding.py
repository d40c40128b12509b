# wrong: the output head counted as a matrix of its own, though it is the tied token embedding
head = mc.vocab_size * mc.n_embd
return 6 * (parameters_on_rank(mc) + head - mc.block_size * mc.n_embd) + 12 * mc.n_layer * mc.n_embd * mc.block_size
