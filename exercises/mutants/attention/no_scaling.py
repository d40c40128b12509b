# wrong: the scores are not scaled by 1/sqrt(head size)
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
