# wrong: the block's part is reweighted, the running output is not: keys seen earlier keep their old weights
merged = torch.logaddexp(lse, block_lse)
out = out + block_out * (block_lse - merged).exp().unsqueeze(-1)
return out, merged
