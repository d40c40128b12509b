# wrong: the scores are k q^T (row = key), so the mask and the softmax act on the transposed matrix
T, head_size = q.size(-2), q.size(-1)
scores = k.float() @ q.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
