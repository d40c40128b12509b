# wrong: the finished all-reduces stay in self.launched, so the next step waits on them and sends nothing new
# in: BucketedDataParallel.finish
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
    flat /= self.size
self.ready = [0] * len(self.buckets)
