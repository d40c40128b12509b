# wrong: dropout is applied to the scores before the softmax: a dropped score becomes 0, not a dropped weight
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
scores = F.dropout(scores, dropout_p)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
return weights.to(v.dtype) @ v
