"""Token trees: every round's candidates merged into one trie (DESIGN.md section 8).

The trie is rooted after the last committed token x_t (the root is not a row:
it is the last ordinary row). Each node is one row: its token, its parent
(-1 for a child of the root) and its depth (>= 1). Nodes are stored in
preorder with every node's children in child order (score, then token id),
so that

- a node's parent always comes before it;
- each subtree hanging from the root (all nodes sharing a first token) is a
  contiguous block: the LP shard unit;
- child order, which sampling verification follows, is the storage order.

Scores are a proposer's estimate that a node will be accepted (a
probability or a relative frequency). A path's scores never increase from
parent to child, so keeping the `budget` best-scoring nodes always keeps
their ancestors.
"""
from __future__ import annotations

from functools import lru_cache

from typing import NamedTuple, Sequence


class TokenTree(NamedTuple):
    tokens: tuple[int, ...]
    parents: tuple[int, ...]    # index of the parent node, -1: the root (x_t)
    depths: tuple[int, ...]     # 1 for a child of the root

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_parents(cls, tokens: Sequence[int], parents: Sequence[int]) -> "TokenTree":
        """A tree from preorder (token, parent) arrays (as they travel between LP ranks)."""
        depths: list[int] = []
        for p in parents:
            depths.append(1 if p < 0 else depths[p] + 1)
        return cls(tuple(tokens), tuple(parents), tuple(depths))

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def units(self) -> tuple[int, ...]:
        """Sizes of the subtrees hanging from the root, in storage order (LP shard units)."""
        starts = [i for i, p in enumerate(self.parents) if p < 0] + [len(self)]
        return tuple(b - a for a, b in zip(starts, starts[1:]))

    def subtree_ends(self) -> tuple[int, ...]:
        """For each node, the index just past its subtree: in preorder node j is an ancestor of i
        (or i itself) exactly when j <= i < end(j)."""
        return _subtree_ends(self.parents)

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to `node` (inclusive)."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def children(self, node: int) -> list[int]:
        """Children of `node` (-1: the root) in child order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def chains(self) -> list[tuple[int, ...]]:
        """Token sequences of the root-to-leaf paths (for tests and reports)."""
        leaves = set(range(len(self))) - set(self.parents)
        return [tuple(self.tokens[i] for i in self.path(leaf)) for leaf in sorted(leaves)]


EMPTY = TokenTree((), (), ())


class TreeBuilder:
    """Collects scored token paths from any number of proposers into one trie.

    `add(path, scores)` inserts a path below the root, `add_tree` a scored tree
    (nodes deeper than `max_depth` left out); a node reached several times keeps its best score. A node's score is clipped
    to its parent's, so scores never increase along a path. `build(budget)` keeps the best `budget` nodes (ties: shallower
    first, then earlier insertion), always with their ancestors."""

    def __init__(self, max_depth: int | None = None):
        self.max_depth = max_depth     # deeper nodes (and so their subtrees) are not inserted
        self._tokens: list[int] = []
        self._parents: list[int] = []
        self._depths: list[int] = []
        self._scores: list[float] = []
        self._child: dict[tuple[int, int], int] = {}   # (parent, token) -> node

    def __len__(self) -> int:
        return len(self._tokens)

    def add(self, path: Sequence[int], scores: Sequence[float] | float = 1.0) -> None:
        """Insert one path below the root (a chain: each node's parent is the one before)."""
        scores = [scores] * len(path) if isinstance(scores, (int, float)) else scores
        self.add_tree(path, range(-1, len(path) - 1), scores)

    def add_tree(self, tokens: Sequence[int], parents: Sequence[int], scores: Sequence[float]) -> None:
        """Insert a scored tree given as parent-before-child arrays (parent -1: the root)."""
        mapped: list[int | None] = []
        for token, parent, score in zip(tokens, parents, scores):
            node = -1 if parent < 0 else mapped[parent]
            depth = 1 if parent < 0 or node is None else self._depths[node] + 1
            if node is None or (self.max_depth is not None and depth > self.max_depth):
                mapped.append(None)     # too deep, or below a node that is
                continue
            score = score if node < 0 else min(score, self._scores[node])
            key = (node, int(token))
            child = self._child.get(key)
            if child is None:
                child = self._child[key] = len(self._tokens)
                self._tokens.append(int(token))
                self._parents.append(node)
                self._depths.append(depth)
                self._scores.append(score)
            elif score > self._scores[child]:
                self._scores[child] = score
            mapped.append(child)

    def _ranked(self) -> tuple[list[int], list[int]]:
        """(nodes best first: score, then shallower, then earlier; depth of every node)."""
        depth = self._depths
        return sorted(range(len(depth)), key=lambda i: (-self._scores[i], depth[i], i)), depth

    def ranking(self, budget: int | None = None) -> list[tuple[float, int]]:
        """(score, depth) of the nodes `build(budget)` keeps, best first: `build(k)` keeps the first k
        (a child never ranks before its parent)."""
        keep, depth = self._ranked()
        return [(self._scores[i], depth[i]) for i in (keep if budget is None else keep[:max(budget, 0)])]

    def build(self, budget: int | None = None) -> TokenTree:
        return self.build_scored(budget)[0]

    def build_scored(self, budget: int | None = None) -> tuple[TokenTree, tuple[float, ...]]:
        """The tree of the best `budget` nodes and each node's score, in the tree's order."""
        keep, depth = self._ranked()
        if budget is not None:
            keep = keep[:max(budget, 0)]
        kept = set(keep)
        kept = {i for i in kept if all(a in kept for a in self._ancestors(i))}
        children: dict[int, list[int]] = {}
        for i in sorted(kept):
            children.setdefault(self._parents[i], []).append(i)
        order: list[int] = []
        stack = [-1]
        while stack:                            # preorder, children by (score, token)
            node = stack.pop()
            if node >= 0:
                order.append(node)
            kids = sorted(children.get(node, ()), key=lambda i: (-self._scores[i], self._tokens[i]))
            stack.extend(reversed(kids))
        index = {old: new for new, old in enumerate(order)}
        return TokenTree(tuple(self._tokens[i] for i in order),
                         tuple(index.get(self._parents[i], -1) for i in order),
                         tuple(depth[i] for i in order)), tuple(self._scores[i] for i in order)

    def _ancestors(self, node: int):
        node = self._parents[node]
        while node >= 0:
            yield node
            node = self._parents[node]


def tree_of(paths: Sequence[Sequence[int]], budget: int | None = None) -> TokenTree:
    """The trie of `paths`, earlier paths first among equals (all scores equal)."""
    builder = TreeBuilder()
    for path in paths:
        builder.add(path)
    return builder.build(budget)


@lru_cache(maxsize=64)      # a round asks twice per tree (its rows, its node frame)
def _subtree_ends(parents: tuple[int, ...]) -> tuple[int, ...]:
    size = [1] * len(parents)
    for u in range(len(parents) - 1, -1, -1):     # children come after their parent
        if parents[u] >= 0:
            size[parents[u]] += size[u]
    return tuple(u + size[u] for u in range(len(parents)))
