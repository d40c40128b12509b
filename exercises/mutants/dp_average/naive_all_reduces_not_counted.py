# wrong: naive mode all-reduces without counted (comm_count.py), so the dp bytes it sends are never counted or logged
# in: NaiveDataParallel.finish
for p in self.params:
    if p.grad is not None:
        dist.all_reduce(p.grad, group=self.group)
        p.grad /= self.size
