# wrong: the weights left in log space: differences of log-sum-exps, not shares of the sum
merged = torch.logaddexp(lse, block_lse)
out = out * (lse - merged).unsqueeze(-1) + block_out * (block_lse - merged).unsqueeze(-1)
return out, merged
