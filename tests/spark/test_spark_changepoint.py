"""E-divisive change-point detector (spark_bench.changepoint): plain numpy, no JVM."""
from __future__ import annotations

import numpy as np
import pytest
import spark_support  # noqa: F401 - puts the repository root on sys.path

from spark_bench.changepoint import DetectorConfig, detect, energy_statistic


def noisy(rng: np.random.Generator, n: int, noise: float = 0.02, level: float = 1e-6) -> np.ndarray:
    return level * (1.0 + noise * rng.standard_normal(n))


@pytest.mark.parametrize("step", [0.10, 0.25])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_step_regression_found_at_the_right_run(step: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = noisy(rng, 60)
    x[37:] *= 1.0 + step
    found = detect(x, seed=seed)
    assert [c.index for c in found] == [37]
    assert found[0].change == pytest.approx(step, abs=0.03)
    assert found[0].confidence >= 0.99


def test_speed_up_is_a_negative_change() -> None:
    rng = np.random.default_rng(5)
    x = noisy(rng, 50)
    x[20:] *= 0.7
    [cp] = detect(x)
    assert cp.index == 20
    assert cp.change == pytest.approx(-0.30, abs=0.03)
    assert cp.after < cp.before


def test_two_changes_in_one_series() -> None:
    rng = np.random.default_rng(9)
    x = noisy(rng, 120)
    x[40:] *= 1.2
    x[90:] /= 1.2
    assert [c.index for c in detect(x)] == [40, 90]


def test_pure_noise_over_100_series_raises_no_alarm() -> None:
    rng = np.random.default_rng(11)
    alarms = {}
    for i in range(100):
        # Gaussian noise plus rare 30% spikes, as on a shared VM.
        x = noisy(rng, 60, noise=0.03)
        x[rng.random(60) < 0.02] *= 1.3
        found = detect(x, seed=i)
        if found:
            alarms[i] = [(c.index, round(c.change, 3)) for c in found]
    assert alarms == {}


def test_small_significant_shift_below_min_change_is_not_reported() -> None:
    rng = np.random.default_rng(4)
    x = noisy(rng, 80, noise=0.002)
    x[40:] *= 1.03  # highly significant, but under the 5% floor
    assert detect(x) == []
    assert [c.index for c in detect(x, DetectorConfig(min_change=0.01))] == [40]


@pytest.mark.parametrize("values", [[], [1.0] * 7, [1.0] * 40, [1.0, float("nan")] * 20])
def test_degenerate_series_have_no_change(values: list[float]) -> None:
    assert detect(values) == []


def test_energy_statistic_peaks_at_the_split() -> None:
    x = np.r_[np.zeros(20), np.ones(15)]
    q = energy_statistic(x, min_size=3)[0]
    assert int(np.argmax(q)) == 20
    assert np.isneginf(q[:3]).all() and np.isneginf(q[-3:]).all()


def test_only_the_most_recent_points_are_analysed() -> None:
    rng = np.random.default_rng(2)
    x = noisy(rng, 300)
    x[250:] *= 1.5
    [cp] = detect(x, DetectorConfig(max_points=100))
    assert cp.index == 250


def _energy_statistic_quadratic(x: np.ndarray, min_size: int) -> np.ndarray:
    """The statistic from its definition, with the full distance matrix: the reference the
    O(n log^2 n) computation must match."""
    x = np.atleast_2d(x)
    rows, n = x.shape
    out = np.full((rows, n + 1), -np.inf)
    dist = np.abs(x[:, :, None] - x[:, None, :])
    for t in range(min_size, n - min_size + 1):
        m, k = t, n - t
        cross = dist[:, :t, t:].sum(axis=(1, 2)) / (m * k)
        left = dist[:, :t, :t].sum(axis=(1, 2)) / (m * (m - 1))
        right = dist[:, t:, t:].sum(axis=(1, 2)) / (k * (k - 1))
        out[:, t] = m * k / n * (2 * cross - left - right)
    return out


@pytest.mark.parametrize("n", [9, 10, 11, 33, 64, 65, 130])
@pytest.mark.parametrize("kind", ["continuous", "ties", "step"])
def test_fast_energy_statistic_equals_the_distance_matrix(n: int, kind: str) -> None:
    rng = np.random.default_rng(n)
    x = rng.lognormal(0.0, 0.05, size=(7, n))
    if kind == "ties":  # a coarse timer: many equal values
        x = np.round(x * 20) / 20
    elif kind == "step":
        x[:, n // 3:] *= 1.2
    fast = energy_statistic(x, min_size=3)
    slow = _energy_statistic_quadratic(x, min_size=3)
    assert np.array_equal(np.isfinite(fast), np.isfinite(slow))
    finite = np.isfinite(slow)
    if finite.any():
        scale = np.abs(slow[finite]).max()
        assert np.allclose(fast[finite], slow[finite], rtol=1e-9, atol=1e-12 * scale)
        assert np.array_equal(fast.argmax(axis=1), slow.argmax(axis=1))


def test_constant_series_statistic_is_exactly_zero() -> None:
    # The permutation test counts ties against a change: rounding noise must not appear.
    q = energy_statistic(np.full((3, 50), 1.7e-3), min_size=5)
    assert (q[np.isfinite(q)] == 0.0).all()


def test_tail_jump_of_the_latest_run_alone_is_suspected_not_a_change() -> None:
    from spark_bench.changepoint import detect_with_tail
    rng = np.random.default_rng(21)
    x = noisy(rng, 80, noise=0.03)
    x[-1] *= 1.2
    found, suspected = detect_with_tail(x, seed=1)
    assert found == []
    assert suspected is not None and suspected.runs == 1 and suspected.index == 79
    assert suspected.change == pytest.approx(0.2, abs=0.06)


def test_tail_jump_confirmed_by_a_rerun_is_a_change_point() -> None:
    from spark_bench.changepoint import detect_with_tail
    rng = np.random.default_rng(21)
    x = noisy(rng, 80, noise=0.03)
    x[-2:] *= 1.2
    found, suspected = detect_with_tail(x, seed=1)
    assert suspected is None
    [cp] = found
    assert cp.index == 78 and cp.change == pytest.approx(0.2, abs=0.06)
    assert np.isnan(cp.p_value)  # no permutation test on two points


def test_tail_jump_negative_controls() -> None:
    """No jump, a spike that came back down, and a jump too small to matter: nothing; a
    jump as long as min_size is the detector's to find, not the tail rule's."""
    from spark_bench.changepoint import detect_with_tail, tail_jump
    rng = np.random.default_rng(22)
    x = noisy(rng, 80, noise=0.03)
    assert detect_with_tail(x, seed=1) == ([], None)
    spike = x.copy()
    spike[-2] *= 1.5
    assert detect_with_tail(spike, seed=1) == ([], None)
    small = noisy(rng, 80, noise=0.002)
    small[-1] *= 1.03  # 15 sigma, but under the 5% min_change
    assert tail_jump(small) is None
    long = x.copy()
    long[-DetectorConfig.min_size:] *= 1.3
    assert tail_jump(long) is None
    found, suspected = detect_with_tail(long, seed=1)
    assert suspected is None and [c.index for c in found] == [80 - DetectorConfig.min_size]
