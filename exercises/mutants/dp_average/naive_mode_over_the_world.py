# wrong: naive mode all-reduces over the default group, every rank of the world, not the DP group
if self.mode == "naive":
    for p in self.params:
        if p.grad is not None:
            dist.all_reduce(counted("dp", p.grad))
            p.grad /= self.size
    return
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
    flat /= self.size
self.launched.clear()
self.ready = [0] * len(self.buckets)
