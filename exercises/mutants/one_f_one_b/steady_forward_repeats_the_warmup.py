# wrong: the steady forwards start again at micro-batch 0, repeating the warmup's and missing the last ones
warmup = min(stages - stage - 1, micro_batches)
order = [("F", i) for i in range(warmup)]
for i in range(micro_batches - warmup):
    order += [("F", i), ("B", i)]
order += [("B", i) for i in range(micro_batches - warmup, micro_batches)]
return order
