# wrong: each weight is kept with probability p (and scaled by 1/p), dropped with probability 1 - p
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
if dropout_p > 0:
    weights = weights * (torch.rand_like(weights) < dropout_p) / dropout_p
return weights.to(v.dtype) @ v
