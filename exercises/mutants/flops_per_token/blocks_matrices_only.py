# wrong: 6 N over the blocks' matrices only (12 L C^2), leaving out the head's V x C matmul
return 6 * 12 * mc.n_layer * mc.n_embd ** 2 + 12 * mc.n_layer * mc.n_embd * mc.block_size
