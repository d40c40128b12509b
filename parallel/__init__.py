"""Parallelism written by hand on torch.distributed, a file per idea, read in this order:

    grid.py             torchrun's environment, the Layout, the dp x pp x cp x tp process grid and its groups
    data_parallel.py    data parallelism: gradients averaged by all-reduce (one per parameter, or buckets overlapped
                        with backward)
    optimizer.py        what the update reads across ranks: AdamW's moments per parameter, the global gradient norm
    zero.py             ZeRO-1 and ZeRO-2: the training state shared out over the data-parallel replicas
    tensor_parallel.py  tensor parallelism (Megatron-LM): each layer's matrices cut across ranks, f and g
    pipeline.py         pipeline parallelism: a stage of the layers per rank, GPipe, 1F1B and interleaved 1F1B
    context_parallel.py context parallelism: each sequence cut across ranks, attention around a ring
    comm_count.py       every all-reduce and send of a step counted, per dimension
    layout.py           the one entry point: every layout rule in one place, and the model as this rank holds it

The same code runs as a simulation on one CPU (gloo over loopback) and for real on GPUs (NCCL), started by
torchrun. The training loop reaches all of it through one small interface, the model as a rank holds it
(layout.RankModel): a ShardedModel (every layer: whole, or its TP slices) or a pipeline stage; torch's own DDP and
FSDP2, the road past the course, answer it too (machinery/job/torch_engines.py).
"""
