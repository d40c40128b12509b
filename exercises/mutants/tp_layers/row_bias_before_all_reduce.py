# wrong: the row-parallel bias added before the all-reduce: counted tp times
# in: RowParallelLinear.forward
return self.g.apply(F.linear(x, self.weight, self.bias), self.group)
