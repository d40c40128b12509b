# wrong: gradients summed over the ranks, not averaged
# in: BucketedDataParallel.finish
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
self.launched.clear()
self.ready = [0] * len(self.buckets)
