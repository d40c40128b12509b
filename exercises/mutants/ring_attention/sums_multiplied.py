# wrong: the log-sum-exps added, as if the two sums multiplied
merged = lse + block_lse
out = out * (lse - merged).exp().unsqueeze(-1) + block_out * (block_lse - merged).exp().unsqueeze(-1)
return out, merged
