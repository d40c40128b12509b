# wrong: f applied to the column-parallel output instead of its input: backward sums different features' gradients
# in: ColumnParallelLinear.forward
return self.f.apply(F.linear(x, self.weight, self.bias), self.group)
