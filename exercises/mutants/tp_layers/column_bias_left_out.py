# wrong: the column-parallel layer forgets its bias slice
# in: ColumnParallelLinear.forward
return F.linear(self.f.apply(x, self.group), self.weight)
