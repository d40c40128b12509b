# wrong: applies the order_seed permutation again on top of window(), which already applies it
B, T = self.batch_size, self.block_size
first = self.position + self.rank * B
windows = [self.window(first + b) for b in range(B)]
if self.permutation is not None:
    windows = [int(self.permutation[w]) for w in windows]
rows = np.stack([self.tokens[w * T : w * T + T + 1] for w in windows]).astype(np.int64)  # (B, T+1)
self.position += self.world_size * B
x, y = rows[:, :-1], rows[:, 1:]
return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
