# wrong: a grad norm exactly at grad_z_threshold stds above the mean warns (>=), where grad_z is a z above it
fired = []
z = 0.0
if self.baseline_ready():
    mean, std = statistics.fmean(self.grad_norms), statistics.pstdev(self.grad_norms)
    z = (grad_norm - mean) / max(std, 1e-8) if math.isfinite(grad_norm) else math.inf
if not (math.isfinite(loss) and math.isfinite(grad_norm)):
    fired.append(("nonfinite", {"loss": str(loss), "grad_norm": str(grad_norm)}))
elif self.baseline_ready() and loss > self.spike_factor * statistics.median(self.losses):
    fired.append(("spike", {"loss": loss, "baseline": statistics.median(self.losses), "factor": self.spike_factor}))
if self.grad_z_threshold and z >= self.grad_z_threshold:
    fired.append(("grad_z", {"grad_norm": grad_norm, "z": z, "threshold": self.grad_z_threshold}))
if not fired:
    self.losses.append(loss)
    self.grad_norms.append(grad_norm)
return z, self._sort(fired)
