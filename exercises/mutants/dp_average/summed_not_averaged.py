# wrong: gradients summed over the ranks, not averaged
for i in range(len(self.buckets)):
    if i not in self.launched and self.mode == "bucketed":
        self._launch(i)
if self.mode == "naive":
    for p in self.params:
        dist.all_reduce(p.grad, group=self.group)
for flat, work in self.launched.values():
    work.wait()
self.launched.clear()
self.ready = [0] * len(self.buckets)
