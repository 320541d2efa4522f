"""The two-stage bootstrap of figures pooled over seeds and the power figure beside a null
(`evaluation.intervals`, METHOD 15).

Coverage tests simulate many experiments whose truth is known and compare the observed
coverage with the coverage this bootstrap is expected to have. Expected coverage: the
percentile interval of a mean of normal data is, to first order, the normal interval
mean +- z sqrt(V*), V* the bootstrap variance. For a balanced design V* is a sum of
independent scaled chi-squares (the ANOVA sums of squares), independent of the estimate's
error, whose variance V is known; so the coverage is c* = E[2 Phi(z sqrt(V* / V)) - 1],
integrated numerically over the chi-squares below. c* holds the known undercoverage of a
percentile bootstrap with few seeds (V* has S - 1 degrees of freedom from the seeds, and
the plug-in variance shrinks it by (S - 1) / S). Tolerance of the observed rate: 3
binomial standard deviations sqrt(c* (1 - c*) / N_sim) (a correct implementation fails
with probability ~0.003; the test is seeded, so it passes or fails for good), after
taking off the coverage lost to the Bt replicates' quantile noise (below).
"""
import numpy as np
import pytest
from scipy import stats

from drubric_jax.evaluation import intervals as iv
from helpers import assert_ci_in_exact_band, two_stage_resamples

Z = float(stats.norm.ppf(0.975))


def _expected_coverage(terms, v_true: float, rng) -> float:
    """c* = E[2 Phi(z sqrt(V* / V)) - 1], V* = sum_k scale_k chi2(df_k) (independent),
    by Monte Carlo over 2e5 draws of each chi-square (error ~1e-4, far below the
    binomial tolerance). terms: [(scale, df)]."""
    v_star = sum(scale * rng.chisquare(df, 200_000) for scale, df in terms)
    return float(np.mean(2.0 * stats.norm.cdf(Z * np.sqrt(v_star / v_true)) - 1.0))


def _quantile_noise_loss(n_boot: int, level: float = 0.95) -> float:
    """Coverage lost because each bound is a quantile of Bt replicates, not of the
    bootstrap distribution: a bound's error has variance q (1 - q) / (Bt phi(z)^2) in
    units of the standard error (q = (1 - level) / 2), and a random shift delta of a bound
    at z changes its side's coverage by -z phi(z) delta^2 / 2 on average; both sides
    together: z q (1 - q) / (Bt phi(z))."""
    q = (1.0 - level) / 2.0
    return Z * q * (1 - q) / (n_boot * stats.norm.pdf(Z))


def _assert_coverage(covered, c_star: float, n_boot: int, what: str) -> None:
    n_sim = len(covered)
    expected = c_star - _quantile_noise_loss(n_boot)
    tol = 3.0 * np.sqrt(c_star * (1.0 - c_star) / n_sim)
    rate = float(np.mean(covered))
    assert abs(rate - expected) <= tol, (
        f"{what}: covered the truth in {rate:.3f} of {n_sim} experiments; expected "
        f"{expected:.3f} +- {tol:.3f}")


def test_two_stage_bootstrap_widens_with_seed_spread():
    """d[s, i] = mu + b_s + e_si, b_s ~ N(0, tau^2), e_si ~ N(0, sigma^2): the two-stage
    interval covers mu at its expected rate, and it widens with tau, staying wider than a
    bootstrap over prompts of the seed-averaged differences (which sees no seed)."""
    rng = np.random.default_rng(20261208)
    # Coverage: S = 15 seeds (with S = 3 a percentile bootstrap undercovers badly).
    s, n, tau, sigma, mu, n_boot, n_sim = 15, 10, 1.0, 1.0, 0.3, 500, 400
    covered = []
    for k in range(n_sim):
        d = mu + tau * rng.normal(size=(s, 1)) + sigma * rng.normal(size=(s, n))
        r = iv.two_stage_bootstrap(list(d), n_boot, k)
        covered.append(r["ci"][0] <= mu <= r["ci"][1])
    # V* = (1 / S^2) sum_s (dbar_s - dbar)^2 + (1 / (S^2 n^2)) sum_{s, i} (e_si - ebar_s)^2:
    # (tau^2 + sigma^2 / n) chi2(S - 1) / S^2 + sigma^2 chi2(S (n - 1)) / (S n)^2;
    # V = (tau^2 + sigma^2 / n) / S.
    c_star = _expected_coverage([((tau ** 2 + sigma ** 2 / n) / s ** 2, s - 1),
                                 (sigma ** 2 / (s * n) ** 2, s * (n - 1))],
                                (tau ** 2 + sigma ** 2 / n) / s, rng)
    # c* = 0.935 here: the nominal 0.95 less the few-seed undercoverage.
    _assert_coverage(covered, c_star, n_boot, "two-stage bootstrap, 15 seeds")

    # Width against tau, at the experiments' own scale (S = 3 seeds, 64 prompts), on the
    # same draws of b_s / tau and e_si for every tau (common random numbers). The mean
    # width over 40 experiments has a relative sd of about 1 / sqrt(2 (S - 1) 40) = 8%
    # (the seeds' chi-square has S - 1 = 2 degrees of freedom); the expected widths
    # (4 z sqrt(E V*) / 2 ~ 0.37, 1.0, 1.8, 3.6 for tau = 0, 0.5, 1, 2) differ by far more.
    s, n, n_exp = 3, 64, 40
    b = rng.normal(size=(n_exp, s, 1))
    e = rng.normal(size=(n_exp, s, n))
    widths = {}
    for t in (0.0, 0.5, 1.0, 2.0):
        two, flat = [], []
        for k in range(n_exp):
            d = mu + t * b[k] + e[k]
            lo, hi = iv.two_stage_bootstrap(list(d), n_boot, k)["ci"]
            two.append(hi - lo)
            reps = iv.resample_weights(n, n_boot, k) @ d.mean(axis=0) / n
            plo, phi = iv.percentile_interval(reps)
            flat.append(phi - plo)
        widths[t] = (float(np.mean(two)), float(np.mean(flat)))
    two_stage = [widths[t][0] for t in sorted(widths)]
    assert all(a < b for a, b in zip(two_stage, two_stage[1:])), widths
    for t in (0.5, 1.0, 2.0):
        assert widths[t][0] > widths[t][1], widths
    # The prompts-only interval does not see tau at all (the seed mean shifts every
    # prompt alike): its width is the same for every tau, to rounding.
    assert np.ptp([widths[t][1] for t in widths]) < 1e-9


def test_a_prompt_shared_by_the_seeds_is_drawn_once_for_all():
    """Crossed design: every seed answers the same prompts, d[s, i] = mu + b_s + a_i +
    e_si with a prompt effect a_i ~ N(0, 1) common to the seeds. Drawing the prompts by id
    once per replicate covers mu at its expected rate; drawing them apart for each seed
    counts the prompt effect S times too little and undercovers (both as predicted)."""
    rng = np.random.default_rng(53)
    s, n, sb, sa, se, mu, n_boot, n_sim = 10, 30, 0.3, 1.0, 0.5, -0.2, 500, 400
    ids = [[f"p{i}" for i in range(n)]] * s
    by_id, nested = [], []
    for k in range(n_sim):
        d = (mu + sb * rng.normal(size=(s, 1)) + sa * rng.normal(size=(1, n))
             + se * rng.normal(size=(s, n)))
        r = iv.two_stage_bootstrap(list(d), n_boot, k, ids=ids)
        by_id.append(r["ci"][0] <= mu <= r["ci"][1])
        r = iv.two_stage_bootstrap(list(d), n_boot, k)
        nested.append(r["ci"][0] <= mu <= r["ci"][1])
    # Two-way ANOVA: seed SS ~ (sb^2 + se^2 / n) chi2(S - 1), prompt SS ~ (sa^2 + se^2 / S)
    # chi2(n - 1), residual SS ~ se^2 chi2((S - 1)(n - 1)), independent of the grand mean,
    # whose variance is V = sb^2 / S + sa^2 / n + se^2 / (S n). By id: V* = seed SS / S^2 +
    # prompt SS / n^2 + residual SS / (S n)^2. Apart per seed: V* = seed SS / S^2 +
    # (prompt SS + residual SS) / (S n)^2, where prompt SS here is S times the sum over
    # prompts of the squared prompt-mean deviations.
    v = sb ** 2 / s + sa ** 2 / n + se ** 2 / (s * n)
    seeds_term = ((sb ** 2 + se ** 2 / n) / s ** 2, s - 1)
    c_id = _expected_coverage([seeds_term, ((sa ** 2 + se ** 2 / s) / n ** 2, n - 1),
                               (se ** 2 / (s * n) ** 2, (s - 1) * (n - 1))], v, rng)
    c_apart = _expected_coverage([seeds_term, ((s * sa ** 2 + se ** 2) / (s * n) ** 2, n - 1),
                                  (se ** 2 / (s * n) ** 2, (s - 1) * (n - 1))], v, rng)
    _assert_coverage(by_id, c_id, n_boot, "prompts drawn by id")        # c* = 0.94
    _assert_coverage(nested, c_apart, n_boot, "prompts drawn per seed")  # c* = 0.70


def test_two_stage_weights_sample_the_exact_two_stage_distribution():
    """The replicates' quantiles against the exact distribution of a two-stage replicate
    (every seed draw and unit draw enumerated, `helpers.two_stage_resamples`), ragged
    seeds without ids and seeds sharing ids; tolerance: the DKW band of
    `assert_ci_in_exact_band`."""
    x = [np.array([0.0, 1.0]), np.array([0.5, 2.0, -1.0])]
    r = iv.two_stage_bootstrap(x, 8000, 3)
    w, p = two_stage_resamples([2, 3])
    flat = np.concatenate(x)
    assert r["mean"] == pytest.approx((0.5 + 0.5) / 2)  # the mean of the seed means
    assert_ci_in_exact_band(r["ci"], w @ flat, p, 8000)
    assert r["units"] == [2, 3] and r["distinct_units"] == 5 and r["seeds"] == 2
    # Shared ids: seed 0 has lists a, b; seed 1 has b, c (b is one unit, drawn once).
    ids = [["a", "b"], ["b", "c"]]
    x = [np.array([1.0, 0.0]), np.array([0.25, -1.0])]
    r = iv.two_stage_bootstrap(x, 8000, 4, ids=ids)
    w, p = two_stage_resamples([2, 2], ["a", "b", "b", "c"])
    reps = w @ np.concatenate(x)
    finite = np.isfinite(reps)
    # A replicate whose drawn seed got none of its ids (e.g. only c drawn, seed 0 drawn)
    # has no value: kept is the exact probability of a finite one, within 4.5 binomial sd.
    p_finite = float(p[finite].sum())
    assert abs(r["kept"] - p_finite) <= 4.5 * np.sqrt(p_finite * (1 - p_finite) / 8000)
    assert_ci_in_exact_band(r["ci"], reps, p, int(round(r["kept"] * 8000)))
    assert r["distinct_units"] == 3 and r["mean"] == pytest.approx((0.5 - 0.375) / 2)
    # Each finite row of weights sums to 1; the draw is a function of the seed alone.
    wb = iv.two_stage_weights([2, 2], 50, 9, ["a", "b", "b", "c"])
    ok = np.all(np.isfinite(wb), axis=1)
    np.testing.assert_allclose(wb[ok].sum(axis=1), 1.0)
    np.testing.assert_array_equal(iv.two_stage_weights([4, 1, 3], 50, 9),
                                  iv.two_stage_weights([4, 1, 3], 50,
                                                       np.random.default_rng(9)))
    assert not np.array_equal(iv.two_stage_weights([4, 1, 3], 50, 9),
                              iv.two_stage_weights([4, 1, 3], 50, 10))
    np.testing.assert_allclose(iv.two_stage_weights([4, 1, 3], 50, 9).sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="each with >= 1 unit"):
        iv.two_stage_weights([2, 0], 10, 0)
    with pytest.raises(ValueError, match="3 ids for 4 units"):
        iv.two_stage_weights([2, 2], 10, 0, ["a", "b", "c"])


def test_standard_error_and_minimal_detectable_difference():
    """se is the replicates' sd: against the exact two-stage sd, within 4.5 sd of a sample
    sd over Bt replicates (var(s^2) = (mu4 - sigma^4) / Bt, to first order; mu4 from the
    exact distribution); the minimal detectable difference is (z_0.975 + z_0.8) se."""
    assert iv.POWER_FACTOR == pytest.approx(stats.norm.ppf(0.975) + stats.norm.ppf(0.8))
    assert 2.80 < iv.POWER_FACTOR < 2.81
    x = [np.array([0.0, 1.0, 0.5]), np.array([1.0, 2.0]), np.array([-0.5, 0.5])]
    n_boot = 20_000
    r = iv.two_stage_bootstrap(x, n_boot, 11)
    w, p = two_stage_resamples([3, 2, 2])
    v = w @ np.concatenate(x)
    m = float(p @ v)
    var = float(p @ (v - m) ** 2)
    mu4 = float(p @ (v - m) ** 4)
    sd_of_var = np.sqrt((mu4 - var ** 2) / n_boot)
    assert abs(r["se"] ** 2 - var) <= 4.5 * sd_of_var
    assert r["minimal_detectable"] == pytest.approx(iv.POWER_FACTOR * r["se"])
    assert r["interval"] == "two-stage bootstrap: seeds, then prompts"
    # A seed with no finite value: nothing to pool.
    empty = iv.two_stage_bootstrap([[np.nan], [1.0]], 10, 0)
    assert np.isnan(empty["mean"]) and empty["units"] == [0, 1]


def test_ratio_and_unpaired_two_stage_figures():
    """A ratio of pooled sums takes the same two-stage replicates for its numerator and
    denominator; an unpaired difference draws the same seeds for both samples and their
    units apart (exact distributions enumerated)."""
    num = [np.array([1.0, 0.0]), np.array([0.5, 0.5, 1.0])]
    den = [np.array([1.0, 1.0]), np.array([0.0, 1.0, 1.0])]
    r = iv.two_stage_ratio(num, den, 8000, 5)
    w, p = two_stage_resamples([2, 3])
    a, b = np.concatenate(num), np.concatenate(den)
    # Point: (1/4 (1 + 0) + 1/6 (2)) / (1/4 (2) + 1/6 (2)).
    assert r["mean"] == pytest.approx((0.25 + 2 / 6) / (0.5 + 2 / 6))
    assert_ci_in_exact_band(r["ci"], iv.ratio(w @ a, w @ b), p, 8000)
    # Unpaired: a has one unit per seed (its seed mean is fixed), b two; the exact
    # distribution sums a's and b's replicate under each seed draw.
    xa = [np.array([1.0]), np.array([3.0])]
    xb = [np.array([0.0, 2.0]), np.array([1.0, 1.0])]
    r = iv.two_stage_unpaired(xa, xb, 8000, 6)
    assert r["mean"] == pytest.approx(2.0 - 1.0)
    vals, probs = [], []
    for s0 in range(2):
        for s1 in range(2):           # the two slots' seeds, 1/4 each
            for u in range(2 ** 4):   # b's unit draws: 2 draws in each slot
                picks = [(u >> k) & 1 for k in range(4)]
                b_mean = np.mean([xb[s0][picks[0]], xb[s0][picks[1]]]
                                 + [xb[s1][picks[2]], xb[s1][picks[3]]])
                vals.append((xa[s0][0] + xa[s1][0]) / 2 - b_mean)
                probs.append(1 / 4 / 16)
    assert_ci_in_exact_band(r["ci"], vals, probs, 8000)
    assert r["units"] == [[1, 2], [1, 2]]
