# wrong: the ready counts carry over into the next step, so from the second step no hook sends during backward
# in: BucketedDataParallel.finish
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
    flat /= self.size
self.launched.clear()
