# wrong: the cooldown runs its backwards last micro-batch first, against the order the next stage sends them
warmup = min(stages - stage - 1, micro_batches)
order = [("F", i) for i in range(warmup)]
for i in range(micro_batches - warmup):
    order += [("F", warmup + i), ("B", i)]
order += [("B", i) for i in reversed(range(micro_batches - warmup, micro_batches))]
return order
