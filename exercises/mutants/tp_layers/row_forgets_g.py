# wrong: the row-parallel layer forgets g: each rank returns its partial product
# in: RowParallelLinear.forward
y = F.linear(x, self.weight)
return y if self.bias is None else y + self.bias
