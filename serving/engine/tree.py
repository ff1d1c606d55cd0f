"""Token trees: the draft's chain and the suffix index's proposal verified in one target forward.

The hybrid chooses per step between the index's proposal and the draft's chain, and the choice is a
guess: where it drafts, an index proposal it passed over is often right. A tree verifies both. Node 0
is the root (the last emitted token, already decided); every other node is one proposed token whose
parent comes before it. The two proposals share their common prefix, so a branch only adds the
tokens where it differs from the chain.

In the target's forward each node sees the cache, its ancestors and itself, at position
`past + depth` (draftwheel.serving.engine.row_invariant's tree layout): exactly what a one-token
decoding step at that position would see, so its logits are bitwise those of plain decoding. Greedy
verification walks from the root, at each node taking the child whose token is the target's argmax;
the walk is the accepted path, and the cache keeps the path's positions only
(`CachedLM.keep_path`). Sampling is not treated: verifying several candidates losslessly at a
temperature needs multi-candidate rejection sampling, so sampled requests verify one proposal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from draftwheel.serving.engine.acceptance import common_prefix
from draftwheel.serving.engine.sampling import greedy


@dataclass(frozen=True)
class Tree:
    tokens: list[int]
    """Node tokens; node 0 is the root (the last emitted token)."""
    parents: list[int]
    """parents[i] < i for every node but the root (-1)."""

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        depths = [0]
        for parent in self.parents[1:]:
            depths.append(depths[parent] + 1)
        return depths

    def visible(self) -> list[list[int]]:
        """Per node, the nodes its attention row sees: its ancestors and itself, root first."""
        seen: list[list[int]] = [[0]]
        for node, parent in enumerate(self.parents[1:], start=1):
            seen.append(seen[parent] + [node])
        return seen

    @property
    def is_chain(self) -> bool:
        return all(parent == node - 1 for node, parent in enumerate(self.parents[1:], start=1))


def chain_with_branch(root: int, chain: list[int], branch: list[int]) -> Tree:
    """The tree of `chain` (nodes 1..len(chain)) and `branch` from the same root, sharing their common
    prefix: the branch's other tokens follow the chain's nodes, leaving it at the last shared node (a
    branch the chain starts with adds nothing; one that starts with the chain makes a longer chain)."""
    shared = common_prefix(chain, branch)
    rest = branch[shared:]
    parents = list(range(-1, len(chain)))  # the chain: node i's parent is i - 1
    for offset in range(len(rest)):
        parents.append(shared if offset == 0 else len(chain) + offset)
    return Tree([root] + chain + rest, parents)


def verify_tree_greedy(tree: Tree, logits: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Walk the tree from the root along the target's argmax. logits[N, V]: the target's scores at
    each node -> (emitted[len(path)], path): the accepted nodes' tokens then the target's own token
    after the last of them, and the path's nodes, root first (len(path) - 1 tokens accepted)."""
    choice = greedy(logits).tolist()  # [N]
    children: dict[int, dict[int, int]] = {}
    for node in range(1, len(tree)):
        children.setdefault(tree.parents[node], {})[tree.tokens[node]] = node
    path = [0]
    while (child := children.get(path[-1], {}).get(choice[path[-1]])) is not None:
        path.append(child)
    emitted = [tree.tokens[node] for node in path[1:]] + [choice[path[-1]]]
    return torch.tensor(emitted, dtype=torch.long), path
