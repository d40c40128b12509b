# wrong: the future is zeroed after the softmax, so the remaining weights no longer sum to 1
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
weights = F.softmax(scores, dim=-1)
weights = weights.masked_fill(future, 0.0)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
