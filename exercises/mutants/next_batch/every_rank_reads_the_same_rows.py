# wrong: every rank reads the same rows
B, T = self.batch_size, self.block_size
starts = [self.window(self.position + b) * T for b in range(B)]
rows = np.stack([self.tokens[s : s + T + 1] for s in starts]).astype(np.int64)
self.position += self.world_size * B
return torch.from_numpy(rows[:, :-1].copy()), torch.from_numpy(rows[:, 1:].copy())
