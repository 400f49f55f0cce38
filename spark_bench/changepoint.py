"""Change-point detection for one benchmark series: E-divisive means with a permutation test.

The method follows Matteson & James (2014), the basis of MongoDB's CI change-point detection
and of Apache Otava (formerly Hunter):

* The energy statistic ``Q(t)`` of a split at ``t`` compares the mean pairwise distance across
  the split with the mean distances inside each side (exponent alpha = 1). It is largest where
  the distribution changes, and it needs no assumption about the noise, which matters because
  benchmark timings are skewed and have outliers.
* Binary segmentation: the best split of every segment is tested, significant ones split the
  segment and the halves are searched again.
* Significance comes from a permutation test: shuffling the points around the candidate
  destroys any change, so the share of shuffles whose best statistic reaches the observed one
  is the p-value. The test runs on a window of ``window`` points either side of the candidate
  (as Otava windows its analysis) so its cost does not grow with the history length, and all
  permutations are evaluated in one vectorised batch.
* A statistically significant but tiny shift is not worth a human's time: changes whose size
  (median after vs median before, between neighbouring change points) is below
  ``min_change`` are merged away at the end.
* The last ``min_size - 1`` runs are out of the statistic's reach, so :func:`tail_jump`
  looks at them alone: the latest runs all off the level before them (by ``min_change``
  and ``min_z`` robust standard deviations each, in one direction). One such run is a
  *suspected* jump (a spike and a step look the same until a rerun); two or more are a
  step the reruns confirmed, and :func:`detect_with_tail` reports it as a change point.

This module is plain numpy so it runs inside a Spark grouped pandas UDF and in unit tests
without a JVM.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DetectorConfig:
    """Knobs of the detector; the defaults suit pytest-benchmark medians."""

    #: A candidate is significant when its permutation p-value is below this.
    alpha: float = 0.01
    #: Number of shuffles per test (the smallest reachable p-value is 1 / (permutations + 1)).
    permutations: int = 199
    #: Fewest points on either side of a change.
    min_size: int = 5
    #: Relative change (0.05 = 5%) below which a change is not reported.
    min_change: float = 0.05
    #: Points either side of a candidate used by the permutation test.
    window: int = 60
    #: Only the most recent points are analysed.
    max_points: int = 3000
    #: The shift of medians must also be this many robust standard errors (from the MAD of
    #: both sides); it keeps outliers next to the edge of a short segment from alarming.
    min_z: float = 3.0
    #: A split may move this many points to where it best separates the two medians.
    refine: int = 3
    #: Upper bound on accepted splits per series, a guard against pathological input.
    max_changes: int = 64


@dataclass(frozen=True)
class ChangePoint:
    """One detected change: the first point of the new level."""

    index: int
    before: float
    after: float
    change: float  # (after - before) / before
    p_value: float
    #: Shift of the medians in robust standard errors: how clearly the levels differ (the
    #: p-value bottoms out at 1 / (permutations + 1) for every clear change).
    z: float = 0.0

    @property
    def confidence(self) -> float:
        return 1.0 - self.p_value


def _distances_to_earlier(x: np.ndarray) -> np.ndarray:
    """``out[r, j] = sum(|x[r, j] - x[r, i]| for i < j)`` in O(n log^2 n) per row.

    With ``L`` the points before ``j`` that are smaller and ``S`` their sum, the distances
    are ``x_j * (2L - j) - 2S + sum(x[:j])`` (ties contribute 0 on either side). ``L`` and
    ``S`` come from a bottom-up merge: at level ``h`` every block of ``2h`` positions is
    put in value order, and each point of a block's right half collects the count and sum
    of the smaller points of its left half. Every pair ``i < j`` meets at exactly one level.
    The value order inside blocks is a stable sort of the global value order by block
    number (a radix sort: block numbers are small integers), so each level is linear.
    """
    rows, n = x.shape
    by_value = np.argsort(x, axis=1, kind="stable")  # positions, in increasing value order
    flat_row = (np.arange(rows) * n)[:, None]
    flat_x = x.ravel()
    less_count = np.zeros(rows * n)
    less_sum = np.zeros(rows * n)
    zero = np.zeros((rows, 1))
    slots = np.arange(n)
    h = 1
    while h < n:
        block = (by_value // (2 * h)).astype(np.int16 if n < 2 ** 15 else np.int64)
        merged = np.take_along_axis(by_value, np.argsort(block, axis=1, kind="stable"), axis=1)
        flat = merged + flat_row
        in_left = (merged % (2 * h)) < h
        count = np.concatenate([zero, np.cumsum(in_left, axis=1)], axis=1)
        total = np.concatenate([zero, np.cumsum(np.where(in_left, flat_x[flat], 0.0), axis=1)],
                               axis=1)
        block_start = (slots // (2 * h)) * (2 * h)  # blocks are contiguous in merged order
        in_right = ~in_left
        # Within one level every position appears once, so fancy += does not collide.
        less_count[flat[in_right]] += (count[:, 1:] - count[:, block_start])[in_right]
        less_sum[flat[in_right]] += (total[:, 1:] - total[:, block_start])[in_right]
        h *= 2
    prefix = np.concatenate([zero, np.cumsum(x, axis=1)[:, :-1]], axis=1)
    return (x * (2.0 * less_count.reshape(rows, n) - slots)
            - 2.0 * less_sum.reshape(rows, n) + prefix)


def _distances_to_all(x: np.ndarray) -> np.ndarray:
    """``out[r, j] = sum(|x[r, j] - x[r, i]| for all i)``, from the sorted row."""
    rows, n = x.shape
    order = np.argsort(x, axis=1)
    s = np.take_along_axis(x, order, axis=1)
    k = np.arange(n)
    below = np.concatenate([np.zeros((rows, 1)), np.cumsum(s, axis=1)[:, :-1]], axis=1)
    above = s.sum(axis=1, keepdims=True) - below - s
    by_rank = s * k - below + above - s * (n - 1 - k)
    out = np.empty_like(x)
    np.put_along_axis(out, order, by_rank, axis=1)
    return out


def energy_statistic(x: np.ndarray, min_size: int) -> np.ndarray:
    """``Q`` for every split of each row of ``x`` (shape (r, n)); ``-inf`` where not allowed.

    Column ``t`` of the result is the split into ``x[:, :t]`` and ``x[:, t:]``. The sums of
    pairwise distances inside each prefix and suffix come from :func:`_distances_to_earlier`
    in O(n log^2 n) instead of the O(n^2) distance matrix (16x faster at 2,000 points).
    """
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    rows, n = x.shape
    out = np.full((rows, n + 1), -np.inf)
    if n < 2 * min_size:
        return out
    # Distances do not change with a shift; from the row minimum the partial sums stay
    # small (a constant series gives exact zeros, as the distance matrix would).
    x = x - x.min(axis=1, keepdims=True)
    below = _distances_to_earlier(x)
    above = _distances_to_all(x) - below
    zero = np.zeros((rows, 1))
    within_prefix = np.concatenate([zero, np.cumsum(below, axis=1)], axis=1)
    within_suffix = np.concatenate([np.cumsum(above[:, ::-1], axis=1)[:, ::-1], zero], axis=1)
    total = within_prefix[:, -1:]
    cross = total - within_prefix - within_suffix
    t = np.arange(min_size, n - min_size + 1)
    m = t.astype(np.float64)
    k = n - m
    q = (2.0 * cross[:, t] / n
         - (m * k / n) * (2.0 * within_prefix[:, t] / (m * (m - 1.0))
                          + 2.0 * within_suffix[:, t] / (k * (k - 1.0))))
    out[:, t] = q
    return out


def _permutation_p_value(x: np.ndarray, cfg: DetectorConfig, rng: np.random.Generator) -> float:
    """p-value of the best split of ``x`` against ``cfg.permutations`` shuffles of ``x``."""
    observed = energy_statistic(x, cfg.min_size).max()
    if not np.isfinite(observed):
        return 1.0
    shuffled = np.argsort(rng.random((cfg.permutations, x.size)), axis=1)
    null = energy_statistic(x[shuffled], cfg.min_size).max(axis=1)
    # Ties count against the change: a constant series must never look significant.
    exceed = int(np.count_nonzero(null >= observed * (1.0 - 1e-12)))
    return (exceed + 1.0) / (cfg.permutations + 1.0)


def _level(x: np.ndarray) -> float:
    return float(np.median(x))


def _l1_cost(x: np.ndarray, split: int) -> float:
    left, right = x[:split], x[split:]
    return float(np.abs(left - np.median(left)).sum() + np.abs(right - np.median(right)).sum())


def _refine(x: np.ndarray, split: int, cfg: DetectorConfig) -> int:
    """Move ``split`` (inside ``x``) to the nearby split with the least absolute deviation
    from the two medians: the energy statistic finds the change, but a single outlier beside
    it can pull its maximum a point or two away."""
    lo = max(cfg.min_size, split - cfg.refine)
    hi = min(x.size - cfg.min_size, split + cfg.refine)
    if lo > hi:
        return split
    return min(range(lo, hi + 1), key=lambda t: (_l1_cost(x, t), abs(t - split)))


def _z_score(left: np.ndarray, right: np.ndarray) -> float:
    """Shift of medians over its robust standard error (MAD scaled to sigma, and the
    1.2533 factor of the median's standard error under normal noise)."""
    resid = np.concatenate([left - np.median(left), right - np.median(right)])
    sigma = 1.4826 * float(np.median(np.abs(resid)))
    shift = abs(float(np.median(right) - np.median(left)))
    if sigma == 0.0:
        return float("inf") if shift > 0.0 else 0.0
    return shift / (1.2533 * sigma * np.sqrt(1.0 / left.size + 1.0 / right.size))


def _relative(before: float, after: float) -> float:
    if before == 0.0:
        return 0.0 if after == 0.0 else float("inf") * np.sign(after)
    return (after - before) / abs(before)


def detect(values: np.ndarray | list[float], cfg: DetectorConfig | None = None,
           seed: int | str = 0) -> list[ChangePoint]:
    """Change points of one series in time order; indexes refer to ``values``."""
    cfg = cfg or DetectorConfig()
    x_all = np.asarray(values, dtype=np.float64)
    offset = max(0, x_all.size - cfg.max_points)
    x = x_all[offset:]
    n = x.size
    if n < 2 * cfg.min_size or not np.all(np.isfinite(x)):
        return []
    if isinstance(seed, str):
        seed = zlib.crc32(seed.encode())
    rng = np.random.default_rng(seed)

    accepted: dict[int, float] = {}  # split index -> p-value
    pending = [(0, n)]
    while pending and len(accepted) < cfg.max_changes:
        lo, hi = pending.pop()
        q = energy_statistic(x[lo:hi], cfg.min_size)[0]
        best = int(np.argmax(q))
        if not np.isfinite(q[best]):
            continue
        split = lo + _refine(x[lo:hi], best, cfg)
        w_lo = max(lo, split - cfg.window)
        w_hi = min(hi, split + cfg.window)
        if _z_score(x[lo:split], x[split:hi]) < cfg.min_z:
            continue
        p = _permutation_p_value(x[w_lo:w_hi], cfg, rng)
        if p >= cfg.alpha:
            continue
        accepted[split] = p
        pending.append((lo, split))
        pending.append((split, hi))

    # Merge away changes too small to matter; removing one changes its neighbours' levels,
    # so drop the smallest first and re-measure.
    splits = sorted(accepted)
    while True:
        bounds = [0, *splits, n]
        sizes = []
        for i, s in enumerate(splits):
            before = _level(x[bounds[i]:s])
            after = _level(x[s:bounds[i + 2]])
            z = _z_score(x[bounds[i]:s], x[s:bounds[i + 2]])
            sizes.append((abs(_relative(before, after)), i, before, after, z))
        small = [item for item in sizes if item[0] < cfg.min_change or item[4] < cfg.min_z]
        if not small:
            break
        splits.pop(min(small)[1])

    return [ChangePoint(index=offset + s, before=before, after=after,
                        change=_relative(before, after), p_value=accepted[s], z=float(z))
            for (_, _, before, after, z), s in zip(sizes, splits, strict=True)]


@dataclass(frozen=True)
class TailJump:
    """The latest ``runs`` runs, all off the level of the runs before them."""

    index: int  # first run of the jump
    runs: int
    before: float  # median of the reference runs before the jump
    after: float  # median of the jumped runs
    change: float  # (after - before) / before
    z: float  # the smallest distance of a jumped run from ``before``, in robust sigmas


def _tail_off(x: np.ndarray, k: int, start: int, cfg: DetectorConfig) -> TailJump | None:
    """The last ``k`` points as a jump from up to ``cfg.window`` points before them (from
    ``start`` on), or None when one of them is not clearly off that level."""
    n = x.size
    ref = x[max(start, n - k - cfg.window):n - k]
    if ref.size < cfg.min_size:
        return None
    level = float(np.median(ref))
    sigma = 1.4826 * float(np.median(np.abs(ref - level)))
    tail = x[n - k:]
    shift = tail - level
    if not (np.all(shift > 0) or np.all(shift < 0)) or level == 0.0:
        return None
    if np.min(np.abs(shift)) < cfg.min_change * abs(level):
        return None
    # A point against a median of `ref.size` points: the median's own error adds to its noise.
    scale = sigma * np.sqrt(1.0 + 1.2533 ** 2 / ref.size)
    z = float("inf") if scale == 0.0 else float(np.min(np.abs(shift)) / scale)
    if z < cfg.min_z:
        return None
    after = float(np.median(tail))
    return TailJump(index=n - k, runs=k, before=level, after=after,
                    change=_relative(level, after), z=z)


def tail_jump(values: np.ndarray | list[float], cfg: DetectorConfig | None = None,
              start: int = 0) -> TailJump | None:
    """The run of latest points off the level before them, when it is shorter than
    ``cfg.min_size`` (a longer one is :func:`detect`'s to find, or not); ``start`` is the
    first point of the current level (the last change point), the reference never reaches
    before it. None when the latest point is on that level."""
    cfg = cfg or DetectorConfig()
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or not np.all(np.isfinite(x[-cfg.min_size:])):
        return None
    found = None
    for k in range(1, cfg.min_size + 1):
        jump = _tail_off(x, k, start, cfg)
        if jump is None:
            break
        found = jump
    if found is None or found.runs >= cfg.min_size:
        return None
    return found


def detect_with_tail(values: np.ndarray | list[float], cfg: DetectorConfig | None = None,
                     seed: int | str = 0) -> tuple[list[ChangePoint], TailJump | None]:
    """:func:`detect`, plus the latest runs: a jump of two or more of them (the latest
    confirmed by a rerun) is one more change point, without a permutation test (its
    ``p_value`` is NaN: too few points after it for one); a jump of the latest run alone
    is returned as *suspected*, not as a change."""
    cfg = cfg or DetectorConfig()
    found = detect(values, cfg, seed)
    jump = tail_jump(values, cfg, start=found[-1].index if found else 0)
    if jump is None or jump.runs == 1:
        return found, jump
    confirmed = ChangePoint(index=jump.index, before=jump.before, after=jump.after,
                            change=jump.change, p_value=float("nan"), z=jump.z)
    return [*found, confirmed], None
