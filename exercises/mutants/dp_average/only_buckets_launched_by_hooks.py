# wrong: waits only for the buckets whose hooks fired and never sends the others (an unused parameter, overlap=False)
if self.mode == "naive":
    for p in self.params:
        if p.grad is not None:
            dist.all_reduce(counted("dp", p.grad), group=self.group)
            p.grad /= self.size
    return
for flat, work in self.launched.values():
    work.wait()
    flat /= self.size
self.launched.clear()
self.ready = [0] * len(self.buckets)
