# wrong: naive mode sums each gradient over the ranks and forgets to divide by the group's size
# in: NaiveDataParallel.finish
for p in self.params:
    if p.grad is not None:
        dist.all_reduce(counted("dp", p.grad), group=self.group)
