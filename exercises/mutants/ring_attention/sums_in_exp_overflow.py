# wrong: the sums added as exponentials, log(e^lse + e^block_lse): right at unit scale, but e^lse overflows fp32 to
# inf once a row's log-sum-exp passes 88.7, and underflows to 0 (its log -inf) once every score lies below -103
merged = torch.log(lse.exp() + block_lse.exp())
out = out * (lse - merged).exp().unsqueeze(-1) + block_out * (block_lse - merged).exp().unsqueeze(-1)
return out, merged
