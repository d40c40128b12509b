# wrong: rank r starts r rows after the position, not r * B rows: the ranks' batches overlap
B, T = self.batch_size, self.block_size
first = self.position + self.rank
starts = [self.window(first + b) * T for b in range(B)]
rows = np.stack([self.tokens[s : s + T + 1] for s in starts]).astype(np.int64)  # (B, T+1)
self.position += self.world_size * B
x, y = rows[:, :-1], rows[:, 1:]
return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
