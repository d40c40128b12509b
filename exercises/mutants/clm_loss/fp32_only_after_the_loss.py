# wrong: the loss is computed in the logits' dtype and only its result is converted to fp32
return F.cross_entropy(logits.flatten(0, 1), targets.flatten()).float()
