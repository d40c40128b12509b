# wrong: no depth scaling of the residual projections
C = self.config.n_embd
if isinstance(module, nn.Embedding):
    nn.init.normal_(module.weight, std=self.embedding_std(C))
if isinstance(module, nn.Linear) and module is not self.lm_head:
    nn.init.normal_(module.weight, std=self.init_std(C))
