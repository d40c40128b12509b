# wrong: divides each bucket and then each parameter's gradient, a view into the same bucket: divided twice
# in: BucketedDataParallel.finish
for i in range(len(self.buckets)):
    if i not in self.launched:
        self._launch(i)
for flat, work in self.launched.values():
    work.wait()
    flat /= self.size
for p in self.params:
    p.grad /= self.size
self.launched.clear()
self.ready = [0] * len(self.buckets)
