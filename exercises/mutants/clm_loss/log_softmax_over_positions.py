# wrong: the log-softmax normalizes over the positions (dim 1), not over the vocabulary
log_p = logits.float().log_softmax(dim=1)  # (B, T, V)
return -log_p.gather(-1, targets.unsqueeze(-1)).mean()
