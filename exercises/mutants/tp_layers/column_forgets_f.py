# wrong: the column-parallel layer forgets f: the input's gradient stays this rank's part
# in: ColumnParallelLinear.forward
return F.linear(x, self.weight, self.bias)
