# wrong: log(softmax(.)) instead of log_softmax: a target probability below fp32's smallest number gives log 0 = -inf
probs = torch.softmax(logits.float(), dim=-1)  # (B, T, V)
return -torch.log(probs.gather(-1, targets.unsqueeze(-1))).mean()
