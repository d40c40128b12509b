# wrong: residual projections scaled by 1 / sqrt(n_layer), not 1 / sqrt(2 n_layer): each block adds two branches
C, L = self.config.n_embd, self.config.n_layer
if isinstance(module, nn.Embedding):
    nn.init.normal_(module.weight, std=self.embedding_std(C))
elif isinstance(module, (CausalSelfAttention, MLP)):
    nn.init.normal_(module.c_proj.weight, std=self.init_std(C) / math.sqrt(L))
elif isinstance(module, nn.Linear) and module is not self.lm_head:
    nn.init.normal_(module.weight, std=self.init_std(C))
    if module.bias is not None:
        nn.init.zeros_(module.bias)
