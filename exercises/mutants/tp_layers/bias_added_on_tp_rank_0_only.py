# wrong: the whole bias is added on tp rank 0 before the sum: the output is right, but only rank 0's bias gets a gradient
# in: RowParallelLinear.forward
bias = self.bias if self.bias is not None and dist.get_rank(self.group) == 0 else None
return self.g.apply(F.linear(x, self.weight, bias), self.group)
