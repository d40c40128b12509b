# wrong: the output merged right, but the running log-sum-exp handed on is the old one: the next block is weighed
# against the keys seen before this one
merged = torch.logaddexp(lse, block_lse)
out = out * (lse - merged).exp().unsqueeze(-1) + block_out * (block_lse - merged).exp().unsqueeze(-1)
return out, lse
