# wrong: each part weighted by the other's share of the sum
merged = torch.logaddexp(lse, block_lse)
out = out * (block_lse - merged).exp().unsqueeze(-1) + block_out * (lse - merged).exp().unsqueeze(-1)
return out, merged
