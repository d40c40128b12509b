# wrong: naive mode all-reduces over the default group, every rank of the world, not the DP group
# in: NaiveDataParallel.finish
for p in self.params:
    if p.grad is not None:
        dist.all_reduce(counted("dp", p.grad))
        p.grad /= self.size
