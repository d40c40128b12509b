# wrong: attention counted for one head, 12 L (C / H) T, where the H heads together span C
head_size = mc.n_embd // mc.n_head
return 6 * (parameters_on_rank(mc) - mc.block_size * mc.n_embd) + 12 * mc.n_layer * head_size * mc.block_size
