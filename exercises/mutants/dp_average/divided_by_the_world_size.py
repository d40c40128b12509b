# wrong: divides by the number of all ranks, not the DP group's: right only when every rank is a DP replica
world = dist.get_world_size()
if self.mode == "naive":
    for p in self.params:
        if p.grad is not None:
            dist.all_reduce(counted("dp", p.grad), group=self.group)
            p.grad /= world
    return
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
    flat /= world
self.launched.clear()
self.ready = [0] * len(self.buckets)
