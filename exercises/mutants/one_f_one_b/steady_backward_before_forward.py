# wrong: the steady state runs its backward before its forward: the last stage goes backward before any forward
warmup = min(stages - stage - 1, micro_batches)
order = [("F", i) for i in range(warmup)]
for i in range(micro_batches - warmup):
    order += [("B", i), ("F", warmup + i)]
order += [("B", i) for i in range(micro_batches - warmup, micro_batches)]
return order
