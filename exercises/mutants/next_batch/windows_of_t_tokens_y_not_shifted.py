# wrong: windows of T tokens, and y is x itself: nothing shifted, each position predicts its own token
B, T = self.batch_size, self.block_size
first = self.position + self.rank * B
starts = [self.window(first + b) * T for b in range(B)]
rows = np.stack([self.tokens[s : s + T] for s in starts]).astype(np.int64)  # (B, T)
self.position += self.world_size * B
return torch.from_numpy(rows.copy()), torch.from_numpy(rows.copy())
