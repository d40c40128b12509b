# wrong: f's backward passes each rank's partial gradient through, without summing the ranks' parts
# in: CopyToTensorParallel.backward
return grad, None
