# wrong: the column-parallel layer forgets its bias slice
# in: ColumnParallelLinear.forward
return F.linear(CopyToTensorParallel.apply(x, self.group), self.weight)
