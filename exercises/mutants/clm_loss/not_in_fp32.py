# wrong: the cross-entropy runs in the logits' dtype: bf16 under autocast
return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
