# wrong: the cooldown stops one short, so the last micro-batch never runs backward
warmup = min(stages - stage - 1, micro_batches)
order = [("F", i) for i in range(warmup)]
for i in range(micro_batches - warmup):
    order += [("F", warmup + i), ("B", i)]
order += [("B", i) for i in range(micro_batches - warmup, micro_batches - 1)]
return order
