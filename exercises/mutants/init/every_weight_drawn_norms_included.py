# wrong: every module with a weight is drawn from the hidden std, the norms' weights included (they start at 1)
C, L = self.config.n_embd, self.config.n_layer
if isinstance(module, nn.Embedding):
    nn.init.normal_(module.weight, std=self.embedding_std(C))
elif isinstance(module, (CausalSelfAttention, MLP)):
    nn.init.normal_(module.c_proj.weight, std=self.init_std(C) / math.sqrt(2 * L))
elif getattr(module, "weight", None) is not None and module is not self.lm_head:
    nn.init.normal_(module.weight, std=self.init_std(C))
    if getattr(module, "bias", None) is not None:
        nn.init.zeros_(module.bias)
