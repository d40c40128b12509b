# wrong: a batch that would cross the end of the epoch is dropped (drop_last) and the next epoch starts at once
B, T = self.batch_size, self.block_size
first = (self.position + self.rank * B) % self.windows_per_epoch
if first + B > self.windows_per_epoch:  # not a whole batch left: start the next epoch
    first = 0
starts = [self.window(first + b) * T for b in range(B)]
rows = np.stack([self.tokens[s : s + T + 1] for s in starts]).astype(np.int64)  # (B, T+1)
self.position += self.world_size * B
x, y = rows[:, :-1], rows[:, 1:]
return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
