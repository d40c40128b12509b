# wrong: summed over the T positions and averaged over the B rows only
B, T = targets.shape
per_position = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")  # (B*T,)
return per_position.view(B, T).sum(1).mean()
