"""Rows of unequal cost (a conversation's images) are dealt to the ranks and micro-steps so that their costs balance;
each step still trains on the same rows, and rows of equal cost keep the contiguous slices."""

from __future__ import annotations

import numpy as np

from bigtrain.data.order import GlobalOrder, balanced


def _assignment(order: GlobalOrder, step: int, dp: int, micro: int) -> list[np.ndarray]:
    return [order.micro_batches(step, rank, dp, micro) for rank in range(dp)]


def test_a_step_trains_on_the_same_rows_and_the_ranks_share_the_cost():
    rng = np.random.default_rng(0)
    costs = rng.choice([0, 200_704, 401_408, 4 * 401_408], size=96)  # 0 to 4 images a conversation
    plain = GlobalOrder(96, 32, shuffle=True, seed=3)
    dealt = GlobalOrder(96, 32, shuffle=True, seed=3, costs=costs)
    for step in range(6):
        sliced, balanced_ = _assignment(plain, step, 4, 2), _assignment(dealt, step, 4, 2)
        assert sorted(np.concatenate(sliced).ravel()) == sorted(np.concatenate(balanced_).ravel())
        spread = [
            max(costs[r].sum() for r in ranks) - min(costs[r].sum() for r in ranks) for ranks in (sliced, balanced_)
        ]
        assert spread[1] <= spread[0] and spread[1] <= costs.max()
        # the positions follow their rows (which epoch's visit of a row it is)
        for rank in range(4):
            positions = dealt.micro_positions(step, rank, 4, 2)
            assert (plain.global_batch(step)[positions - step * 32] == dealt.micro_batches(step, rank, 4, 2)).all()


def test_the_costliest_rows_go_to_different_ranks_first():
    # two conversations with large images and two without, one row per micro-step on 2 ranks: one of each per rank
    bins = balanced(np.array([10, 10, 1, 1]), bins=4, capacity=1)
    rank0, rank1 = [bins[0], bins[2]], [bins[1], bins[3]]
    assert sorted(np.concatenate(rank0)) == [0, 2] and sorted(np.concatenate(rank1)) == [1, 3]


def test_rows_of_equal_cost_keep_the_contiguous_slices():
    plain = GlobalOrder(40, 8, shuffle=True, seed=1)
    same = GlobalOrder(40, 8, shuffle=True, seed=1, costs=np.full(40, 7))
    for step in range(3):
        for rank in range(2):
            assert (plain.micro_batches(step, rank, 2, 2) == same.micro_batches(step, rank, 2, 2)).all()
