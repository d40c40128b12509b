# wrong: the head is initialized as one more Linear, overwriting the tied embedding with the hidden std
C, L = self.config.n_embd, self.config.n_layer
if isinstance(module, nn.Embedding):
    nn.init.normal_(module.weight, std=self.embedding_std(C))
elif isinstance(module, (CausalSelfAttention, MLP)):
    nn.init.normal_(module.c_proj.weight, std=self.init_std(C) / math.sqrt(2 * L))
elif isinstance(module, nn.Linear):
    nn.init.normal_(module.weight, std=self.init_std(C))
    if module.bias is not None:
        nn.init.zeros_(module.bias)
