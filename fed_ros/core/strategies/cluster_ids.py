"""Stable cluster ids across rounds: a regrouped fleet keeps the ids of the clusters it kept.

Clustering strategies (FedDRMan, FeDepth, RND) regroup robots every round; the groups come out
in no particular order. Cluster ids are what robots, the model store and every report follow
from round to round, so a new group takes the id of the previous cluster it shares most
members with (Hungarian matching) and only a truly new group gets a fresh id. This depends
only on memberships, not on models or on any one strategy, so it stands alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment


def match_cluster_ids(
    groups: Sequence[Sequence[str]], previous: Mapping[str, int], available: Sequence[int]
) -> list[int]:
    """Stable ids for new groups: Hungarian matching on member overlap with previous clusters.

    Groups not matched to any of `available` get fresh ids above all known ones.
    """
    avail = sorted(set(int(a) for a in available))
    ids: list[int] = [-1] * len(groups)
    if avail and groups:
        overlap = np.zeros((len(groups), len(avail)))
        col = {c: j for j, c in enumerate(avail)}
        for g, members in enumerate(groups):
            for rid in members:
                c = previous.get(rid)
                if c is not None and c in col:
                    overlap[g, col[c]] += 1
        # Tiny preference for earlier groups / lower ids, but only when the matrix is not square:
        # a square one's full matchings all have the same tie sum, so there linear_sum_assignment's
        # own (deterministic) order breaks ties (two groups tied on one old cluster -> ids [1, 0]).
        tie = 1e-6 * (np.arange(len(avail))[None, :] + np.arange(len(groups))[:, None])
        rows, cols = linear_sum_assignment(-(overlap - tie))
        for r, c in zip(rows, cols):
            ids[r] = avail[c]
    nxt = (max(avail) + 1) if avail else 0
    for g in range(len(groups)):
        if ids[g] < 0:
            ids[g] = nxt
            nxt += 1
    return ids
