# wrong: an untied head is drawn as one more Linear, sqrt(2 / (5 C)), not as the embedding, 0.25 / sqrt(C)
C, L = self.config.n_embd, self.config.n_layer
if isinstance(module, nn.Embedding):
    nn.init.normal_(module.weight, std=self.embedding_std(C))
elif isinstance(module, (CausalSelfAttention, MLP, SwiGLU)):
    nn.init.normal_(module.c_proj.weight, std=self.init_std(C) / math.sqrt(2 * L))
elif isinstance(module, nn.Linear) and not (module is self.lm_head and self.config.tie_embeddings):
    nn.init.normal_(module.weight, std=self.init_std(C))
    if module.bias is not None:
        nn.init.zeros_(module.bias)
