"""The Jacobi lookahead window (DESIGN.md sections 2 and 4).

Pure data: token ids in Python lists, no tensors, no model.

Coordinates. With R = N-1 levels, level r holds guesses for logical position
p + j + r where j is the cell's column and p the position of the ordinary row
x_t. Level 0 starts at column 1 (its column 0 is the live token x_t itself);
levels r >= 1 start at column 0. Every level r >= 1 spans the same columns
0..M-1 and level 0 spans 1..M-1, where M is the window's current width.

Warmup: level 0 is seeded with W+R-2 tokens (M = W+R-1) and one level is
added per round; each warmup round also drops the first column, so after R-1
rounds the window is exactly W wide with level sizes [W-1, W, ..., W].
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class JacobiWindow:
    ngram: int  # N
    width: int  # W (steady-state columns)
    levels: list[list[int]] = field(default_factory=list)

    @classmethod
    def seeded(cls, ngram: int, width: int, seed_tokens: list[int]) -> "JacobiWindow":
        """A warmup window whose level 0 holds W+N-3 seed tokens."""
        need = width + ngram - 3
        if len(seed_tokens) != need:
            raise ValueError(f"window seed needs {need} tokens, got {len(seed_tokens)}")
        return cls(ngram, width, [list(seed_tokens)])

    @property
    def depth(self) -> int:
        """Number of filled levels (R once warm)."""
        return len(self.levels)

    @property
    def warm(self) -> bool:
        return self.depth == self.ngram - 1

    @property
    def columns(self) -> int:
        """Current width M: level 0 covers columns 1..M-1."""
        return len(self.levels[0]) + 1

    def advance(self, deepest_outputs: list[int]) -> None:
        """Move the window one column after a round.

        `deepest_outputs` holds the model's prediction at each cell of the
        deepest level, in that level's storage order (for level 0 that starts
        at column 1: the ordinary row's prediction is not part of the window)."""
        if self.warm:
            lv = self.levels
            self.levels = [lv[1][1:]] + lv[2:] + [list(deepest_outputs)]
        else:
            # drop the first column of every level and grow a new deepest level;
            # level 0's outputs start at column 1, deeper levels' at column 0
            grown = deepest_outputs if self.depth == 1 else deepest_outputs[1:]
            self.levels = [level[1:] for level in self.levels] + [list(grown)]

    def ngrams(self, key_token: int, deepest_outputs: list[int]) -> list[tuple[int, tuple[int, ...]]]:
        """The W n-grams along the trajectory of a warm window after a round.

        Column j gives key = b_j (x_t for j = 0) and suffix
        (levels[1][j], ..., levels[R-1][j], z_j)."""
        if not self.warm:
            return []
        keys = [key_token] + self.levels[0]
        deep = self.levels[1:]
        return [
            (keys[j], tuple(level[j] for level in deep) + (deepest_outputs[j],))
            for j in range(self.columns)
        ]
