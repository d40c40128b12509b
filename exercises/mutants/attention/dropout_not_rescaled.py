# wrong: dropped weights are zeroed but the kept ones are not scaled by 1/(1 - p), so the weights shrink
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
weights = weights * (torch.rand_like(weights) >= dropout_p)
return weights.to(v.dtype) @ v
