# wrong: the mask starts one diagonal too late (triu offset 2): position t also sees t + 1
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=2)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
weights = F.dropout(weights, dropout_p)
return weights.to(v.dtype) @ v
