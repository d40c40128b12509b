# wrong: the two parts averaged, whatever each part's share of the softmax
return (out + block_out) / 2, torch.logaddexp(lse, block_lse)
