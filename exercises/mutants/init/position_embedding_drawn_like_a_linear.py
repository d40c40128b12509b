# wrong: the position embedding gets the hidden std sqrt(2 / (5 C)), not the token embedding's 0.25 / sqrt(C)
C, L = self.config.n_embd, self.config.n_layer
if module is self.wte:
    nn.init.normal_(module.weight, std=self.embedding_std(C))
elif module is self.wpe:
    nn.init.normal_(module.weight, std=self.init_std(C))
elif isinstance(module, (CausalSelfAttention, MLP)):
    nn.init.normal_(module.c_proj.weight, std=self.init_std(C) / math.sqrt(2 * L))
elif isinstance(module, nn.Linear) and module is not self.lm_head:
    nn.init.normal_(module.weight, std=self.init_std(C))
    if module.bias is not None:
        nn.init.zeros_(module.bias)
