# wrong: scaled by 1/sqrt(C), the model's width H * head size, not by 1/sqrt(head size)
B, H, T, head_size = q.shape
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(H * head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
