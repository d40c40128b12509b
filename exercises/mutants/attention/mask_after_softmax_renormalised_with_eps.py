# wrong: the future is zeroed after the softmax, then each row divided by its sum + 1e-12: a future score 100 above the others zeroes the row
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
weights = F.softmax(scores, dim=-1)
weights = weights.masked_fill(future, 0.0)
weights = weights / (weights.sum(-1, keepdim=True) + 1e-12)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
