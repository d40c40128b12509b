# wrong: p - s warmup forwards instead of p - s - 1, so each stage holds one micro-batch more than it needs
warmup = min(stages - stage, micro_batches)
order = [("F", i) for i in range(warmup)]
for i in range(micro_batches - warmup):
    order += [("F", warmup + i), ("B", i)]
order += [("B", i) for i in range(micro_batches - warmup, micro_batches)]
return order
