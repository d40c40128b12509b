# wrong: the mask is the lower triangle (tril): position t sees itself and the future, not the past
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
past = torch.ones(T, T, dtype=torch.bool, device=q.device).tril(diagonal=-1)
scores = scores.masked_fill(past, float("-inf"))
weights = F.softmax(scores, dim=-1)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
