# wrong: only CausalSelfAttention's and MLP's c_proj are scaled by depth; SwiGLU's c_proj (--arch llama) is forgotten
C, L = self.config.n_embd, self.config.n_layer
if isinstance(module, nn.Embedding) or (module is self.lm_head and not self.config.tie_embeddings):
    nn.init.normal_(module.weight, std=self.embedding_std(C))
elif isinstance(module, (CausalSelfAttention, MLP)):
    nn.init.normal_(module.c_proj.weight, std=self.init_std(C) / math.sqrt(2 * L))
elif isinstance(module, nn.Linear) and module is not self.lm_head:
    nn.init.normal_(module.weight, std=self.init_std(C))
    if module.bias is not None:
        nn.init.zeros_(module.bias)
