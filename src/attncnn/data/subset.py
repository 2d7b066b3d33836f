"""Class-balanced subsets of a labelled split (for the paper's small-data experiments)."""

from __future__ import annotations

import torch

from ..errors import InputError

__all__ = ["class_balanced_subset", "held_out_indices"]


def class_balanced_subset(labels: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Indices of ``n`` examples, as equally many per class as possible.

    Each of the ``K`` classes present gets ``n // K`` examples and the remainder goes one each to the
    classes with the smallest labels; a class with too few examples gives all it has and the rest is
    shared among the others the same way. Within a class the examples are drawn by a generator seeded
    with ``seed`` (a pure function of ``labels, n, seed``).

    Returns:
        sorted ``int64`` CPU tensor of ``n`` distinct indices into ``labels``.

    Raises:
        InputError: ``n <= 0`` or ``n > len(labels)``.
    """
    labels = labels.detach().to("cpu").long().reshape(-1)
    total = len(labels)
    if n <= 0 or n > total:
        raise InputError(f"subset size must be between 1 and {total} (the number of examples), got {n}")
    classes, counts = torch.unique(labels, sorted=True, return_counts=True)
    counts = counts.tolist()
    # Water-filling: the highest level L with sum(min(count, L)) <= n, then one more each for the
    # first classes (in label order) that still have examples, until n is reached.
    lo, hi = 0, max(counts)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in counts) <= n:
            lo = mid
        else:
            hi = mid - 1
    quota = [min(c, lo) for c in counts]
    remaining = n - sum(quota)
    for k, c in enumerate(counts):
        if remaining == 0:
            break
        if c > lo:
            quota[k] += 1
            remaining -= 1
    g = torch.Generator().manual_seed(int(seed))
    picked = []
    for k, c in enumerate(classes.tolist()):
        members = torch.nonzero(labels == c).flatten()
        picked.append(members[torch.randperm(len(members), generator=g)[: quota[k]]])
    return torch.sort(torch.cat(picked)).values


def held_out_indices(labels: torch.Tensor, subset: int, seed: int, n: int) -> torch.Tensor:
    """Indices of up to ``n`` examples that a run trained on ``class_balanced_subset(labels, subset,
    seed)`` never saw, chosen from the rest class-balanced in the same way (same ``seed``): a
    validation set for a subset cell that does not look at the test set.

    Returns:
        sorted ``int64`` CPU tensor of ``min(n, len(labels) - subset)`` distinct indices into
        ``labels``, none of them in the training subset.

    Raises:
        InputError: ``n <= 0``; ``subset`` outside ``[1, len(labels)]``, or equal to it (the subset
            is the whole split: nothing is held out).
    """
    labels = labels.detach().to("cpu").long().reshape(-1)
    if n <= 0:
        raise InputError(f"the held-out set needs n >= 1 examples, got {n}")
    seen = class_balanced_subset(labels, subset, seed)
    unseen = torch.ones(len(labels), dtype=torch.bool)
    unseen[seen] = False
    rest = torch.nonzero(unseen).flatten()
    if len(rest) == 0:
        raise InputError(f"a subset of {subset} of {len(labels)} examples leaves none out to validate on; "
                         "validate a smaller cell")
    return rest[class_balanced_subset(labels[rest], min(n, len(rest)), seed)]
