# wrong: shifts the targets a second time: next_batch's y is already the next token
return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), targets[:, 1:].flatten())
