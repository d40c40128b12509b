# wrong: the warmup is p - s - 1 even with fewer micro-batches: forwards of micro-batches that do not exist
warmup = stages - stage - 1
order = [("F", i) for i in range(warmup)]
for i in range(micro_batches - warmup):
    order += [("F", warmup + i), ("B", i)]
order += [("B", i) for i in range(micro_batches - warmup, micro_batches)]
return order
