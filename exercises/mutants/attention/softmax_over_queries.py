# wrong: the softmax runs over the queries (dim -2), not over the keys
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-2)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
