# wrong: divides by the number of all ranks, not the DP group's: right only when every rank is a DP replica
# in: BucketedDataParallel.finish
world = dist.get_world_size()
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
    flat /= world
self.launched.clear()
self.ready = [0] * len(self.buckets)
