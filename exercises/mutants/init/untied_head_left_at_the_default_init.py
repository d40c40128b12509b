# wrong: the head is skipped whether tied or not, so an untied head keeps nn.Linear's default init (std 1 / sqrt(3 C))
C, L = self.config.n_embd, self.config.n_layer
if isinstance(module, nn.Embedding):
    nn.init.normal_(module.weight, std=self.embedding_std(C))
elif isinstance(module, (CausalSelfAttention, MLP, SwiGLU)):
    nn.init.normal_(module.c_proj.weight, std=self.init_std(C) / math.sqrt(2 * L))
elif isinstance(module, nn.Linear) and module is not self.lm_head:
    nn.init.normal_(module.weight, std=self.init_std(C))
    if module.bias is not None:
        nn.init.zeros_(module.bias)
