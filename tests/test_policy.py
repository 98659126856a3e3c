"""RoundRobinPolicy (unit, against a one-request-at-a-time reference) and rollout()."""

from __future__ import annotations

import numpy as np
import pytest

from carbon_gym.policy import Policy, RoundRobinPolicy


def reference_round_robin(masks: list[np.ndarray]) -> list[np.ndarray]:
    """Slow, obviously-correct round-robin: one request at a time, skipping masked datacenters."""
    cursor = 0
    out = []
    for mask in masks:
        k, c = mask.shape
        d = c - 1
        action = np.full(k, d)
        for i in range(k):
            for step in range(d):
                cand = (cursor + step) % d
                if mask[i, cand]:
                    action[i] = cand
                    cursor = (cand + 1) % d
                    break
        out.append(action)
    return out


def random_masks(rng: np.random.Generator, steps: int, k: int, d: int, kind: str) -> list[np.ndarray]:
    masks = []
    for _ in range(steps):
        n = int(rng.integers(0, k + 1))
        m = np.zeros((k, d + 1), dtype=bool)
        m[:, d] = True
        if kind == "all":
            m[:n, :d] = True
        elif kind == "same":
            row = rng.random(d) < 0.6
            m[:n, :d] = row
        else:
            m[:n, :d] = rng.random((n, d)) < 0.6
        masks.append(m)
    return masks


@pytest.mark.parametrize("kind", ["all", "same", "mixed"])
def test_round_robin_matches_reference(kind: str) -> None:
    rng = np.random.default_rng(3)
    masks = random_masks(rng, 40, 16, 5, kind)
    policy = RoundRobinPolicy()
    got = [policy.act(None, {"action_mask": m}) for m in masks]
    want = reference_round_robin(masks)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_round_robin_cycles_and_resets() -> None:
    mask = np.zeros((6, 4), dtype=bool)
    mask[:, 3] = True
    mask[:5, :3] = True
    p = RoundRobinPolicy()
    np.testing.assert_array_equal(p.act(None, {"action_mask": mask}), [0, 1, 2, 0, 1, 3])
    np.testing.assert_array_equal(p.act(None, {"action_mask": mask}), [2, 0, 1, 2, 0, 3])
    p.reset()
    np.testing.assert_array_equal(p.act(None, {"action_mask": mask}), [0, 1, 2, 0, 1, 3])
    mask[:5, 1] = False  # datacenter 1 down: skipped
    p.reset()
    np.testing.assert_array_equal(p.act(None, {"action_mask": mask}), [0, 2, 0, 2, 0, 3])
    assert isinstance(p, Policy)


def test_round_robin_defers_when_nothing_allowed() -> None:
    mask = np.zeros((3, 3), dtype=bool)
    mask[:, 2] = True
    np.testing.assert_array_equal(RoundRobinPolicy().act(None, {"action_mask": mask}), [2, 2, 2])


def test_round_robin_follows_a_change_of_mask_shape() -> None:
    rng = np.random.default_rng(8)
    masks = random_masks(rng, 10, 16, 5, "all") + random_masks(rng, 10, 7, 3, "all") + random_masks(rng, 10, 16, 5, "mixed")
    p = RoundRobinPolicy()
    got = []
    for m in masks:  # the reference keeps one cursor too; restart both at each shape change
        if got and m.shape != masks[len(got) - 1].shape:
            p.reset()
        got.append(p.act(None, {"action_mask": m}))
    want = reference_round_robin(masks[:10]) + reference_round_robin(masks[10:20]) + reference_round_robin(masks[20:])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
        assert g.shape == w.shape
