# wrong: the scores and the softmax in the inputs' dtype: bf16 scores near 128 are off by up to 0.5
T, head_size = q.size(-2), q.size(-1)
scores = q @ k.transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T), in q's dtype
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
weights = F.dropout(weights, dropout_p)
return weights @ v
