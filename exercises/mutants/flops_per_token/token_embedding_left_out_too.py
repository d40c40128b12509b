# wrong: leaves out the token embedding as well (Kaplan's non-embedding N), but it is the head's matmul
embeddings = (mc.block_size + mc.vocab_size) * mc.n_embd
return 6 * (parameters_on_rank(mc) - embeddings) + 12 * mc.n_layer * mc.n_embd * mc.block_size
