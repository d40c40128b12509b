# wrong: the warmup counts the stages before this one (s), not after it (p - s - 1)
warmup = min(stage, micro_batches)
order = [("F", i) for i in range(warmup)]
for i in range(micro_batches - warmup):
    order += [("F", warmup + i), ("B", i)]
order += [("B", i) for i in range(micro_batches - warmup, micro_batches)]
return order
