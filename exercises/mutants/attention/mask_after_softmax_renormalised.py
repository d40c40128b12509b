# wrong: the future is zeroed after the softmax, then each row renormalised: a future score 100 above the others underflows them to 0 (0 / 0)
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
weights = F.softmax(scores, dim=-1)
weights = weights.masked_fill(future, 0.0)
weights = weights / weights.sum(-1, keepdim=True)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
