# wrong: 6 N over every parameter, the position table too, though a lookup does no matmul
return 6 * parameters_on_rank(mc) + 12 * mc.n_layer * mc.n_embd * mc.block_size
