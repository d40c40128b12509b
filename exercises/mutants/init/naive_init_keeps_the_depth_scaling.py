# wrong: the naive init still scales the residual projections by depth: it is meant to be one std everywhere
C, L, naive = self.config.n_embd, self.config.n_layer, self.config.naive_init_std
if isinstance(module, nn.Embedding):
    nn.init.normal_(module.weight, std=naive or self.embedding_std(C))
elif isinstance(module, (CausalSelfAttention, MLP)):
    nn.init.normal_(module.c_proj.weight, std=(naive or self.init_std(C)) / math.sqrt(2 * L))
elif isinstance(module, nn.Linear) and module is not self.lm_head:
    nn.init.normal_(module.weight, std=naive or self.init_std(C))
    if module.bias is not None:
        nn.init.zeros_(module.bias)
