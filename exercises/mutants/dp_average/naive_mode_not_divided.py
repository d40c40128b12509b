# wrong: naive mode sums each gradient over the ranks and forgets to divide by the group's size
if self.mode == "naive":
    for p in self.params:
        if p.grad is not None:
            dist.all_reduce(counted("dp", p.grad), group=self.group)
    return
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
    flat /= self.size
self.launched.clear()
self.ready = [0] * len(self.buckets)
