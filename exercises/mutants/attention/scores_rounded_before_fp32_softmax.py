# wrong: q k^T in the inputs' dtype, upcast only for the softmax: the bf16 rounding of the scores is already done
T, head_size = q.size(-2), q.size(-1)
scores = q @ k.transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T), in q's dtype
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores.float(), dim=-1)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
