# wrong: the row-parallel bias split evenly over the ranks before the all-reduce: right output, 1/tp of its gradient
# in: RowParallelLinear.forward
group_size = dist.get_world_size(self.group)
bias = None if self.bias is None else self.bias / group_size
return self.g.apply(F.linear(x, self.weight, bias), self.group)
