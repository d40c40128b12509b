# wrong: the logits flattened time-major (T, B) against targets flattened row-major (B, T)
return F.cross_entropy(logits.float().transpose(0, 1).flatten(0, 1), targets.flatten())
