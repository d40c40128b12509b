# wrong: waits only for the buckets whose hooks fired and never sends the others (an unused parameter, overlap=False)
# in: BucketedDataParallel.finish
for flat, work in self.launched.values():
    work.wait()
    flat /= self.size
self.launched.clear()
self.ready = [0] * len(self.buckets)
