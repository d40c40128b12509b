# wrong: one (T, T) dropout mask shared by every batch row and head, not one coin per weight
T, head_size = q.size(-2), q.size(-1)
scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(head_size)  # (B, H, T, T)
future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
scores = scores.masked_fill(future, float("-inf"))
weights = F.softmax(scores, dim=-1)
if dropout_p > 0:
    keep = torch.rand(T, T, device=q.device) >= dropout_p  # (T, T)
    weights = weights * keep / (1 - dropout_p)
return weights.to(v.dtype) @ v
