# wrong: all forwards first: GPipe under another name
return [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
