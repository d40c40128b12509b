# wrong: the finished all-reduces stay in self.launched, so the next step waits on them and sends nothing new
if self.mode == "naive":
    for p in self.params:
        if p.grad is not None:
            dist.all_reduce(counted("dp", p.grad), group=self.group)
            p.grad /= self.size
    return
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
    flat /= self.size
self.ready = [0] * len(self.buckets)
