"""``k="auto"``: the K governor chooses each window's draft length.

For its first windows it prices one more draft token after every draft step; from then on it drafts, per window,
the K whose measured window time per expected committed token is least, trying a neighbouring K on every few
windows. Its models and the choices behind them are in :class:`KGovernor`'s docstring; ``sl.bench.k_sweep`` and
``scripts/governor_whatif.py`` measure it against fixed K.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["KGovernor", "WindowOutcome", "distinct_experts_curve"]


@dataclass
class WindowOutcome:
    """One verified window as the governor sees it. ``routing``: the verification pass's routing per layer (int
    arrays ``[T, top_k]`` over the window's inputs); ``stall`` (seconds) is None where the clock cannot time it
    mid-run."""

    accepted: int
    drafted: int
    routing: list
    copies: int = 0
    stall: float | None = None
    t_copy: float = 0.0
    elapsed: float | None = None  # seconds from the window's first draft step to its commit


@dataclass
class KGovernor:
    """``k="auto"``: draft the window length expected to give the least time per committed token.

    Two rules, one after the other:

    * **Measured** (from window ``measured_after`` on): at each window's start, the K with the least measured
      window time (decayed mean over the windows that drafted that K: drafting, verification, stalls, host
      work, everything the clock saw) over E[tokens](K) below. Every ``explore_every``-th window drafts a
      neighbour of that K instead (K − s and K + s in turn, s = max(1, K // 4): at long K one token more or less
      is lost in the noise), so the choice can move as the text, the cache or the link change. A K counts as
      measured while it holds ``min_arm`` decayed windows; longer K than those are priced off a line fitted
      through their times (``extrapolate``), so a run whose best K is long gets there in a jump, not a
      neighbour at a time. A window whose K is chosen up front also tells the prefetcher its length, so its
      copies are planned for the tokens it will verify.
      This is a hill-climbing bandit over K: it needs no cost model, so costs a model leaves out (misses
      computed on the host, a draft step's overheads, a prefetch planned too wide) are counted as they
      happen. ``scripts/governor_whatif.py`` measures it against fixed K and the priced rule alone
      (``docs/measured/closer_to_bound.md``). Its cost: it needs windows to learn, so a short run (a few
      prompts of 48 tokens: ~25 windows) may end before it settles.
    * **Priced** (the first ``measured_after`` windows; every window with ``measured_after=0``): after every
      draft step, one more token is priced with the model below, so the first windows already adapt and the
      measured rule starts from several measured K.

    Model of a window of K drafted tokens, every term measured on this run rather than assumed:

        E[tokens](K) = 1 + Σ_{i≤K} Π_{m≤i} α_m                  committed tokens; α_m = acceptance at depth m
        T(K)         = K · t_draft + t_verify(K+1, D(K+1)) + x · t_copy · U(K)
        U(K)         = U(j) + m · Σ_layers [D_l(K+1) − D_l(j+1)] experts the window will copy

    * ``α_m`` is the acceptance of the m-th draft token given the ones before it were accepted, counted per
      depth (decayed counts, shrunk towards the pooled rate). Acceptance is bursty — in a run of easy or
      repeated text the draft is right many times in a row — so deep tokens are accepted more often than a
      single i.i.d. rate predicts, and a geometric model undervalues long windows.
    * ``D_l(n)``: mean number of distinct experts that n consecutive tokens route to in layer l, measured on
      the target's routing of the prompt and the recent committed tokens (a sliding window over a continuous
      history, so it does not depend on the K drafted so far). It prices both the copies (``U``) and the
      verification pass (``t_verify``).
    * ``U(j)`` is what the forecast says is still missing after j draft steps (not landed on the device: a copy
      still in flight is one the window pays for); ``m`` the fraction of the forecast missing so (how likely a
      newly needed expert is a copy); ``x`` the exposed fraction of copy time, measured per window as
      stall / (copies · t_copy) on the simulated clock (prefetches during drafting and copy/compute overlap hide
      part of it).
    * Every ``explore_every``-th window drafts on regardless of the costs, so depths the model would never
      choose still get measured: an estimate learnt only from short windows would keep the governor short. It
      stops (at ``k_max`` at the latest) where the next token's chance of being reached at all, every token
      before it accepted (Π α_m), falls below ``explore_reach``: a token past that point is rarely verified
      at a depth anyone learns from, and each costs a draft step and a wider verification. With a 2-bit draft
      (acceptance ~0.73) that is 5 tokens instead of 16; with a 4-bit one (~0.95) it is still ``k_max``
      (``docs/measured/closer_to_bound.md`` measured both rules).
      ``optimism`` (off by default) is the textbook alternative, an upper-confidence bonus
      ``optimism / sqrt(reach_m + prior)`` on acceptance at rarely reached depths; it can trap itself at a short
      K after one early rejection (one rejection at depth 1 makes every deeper depth look unreached and
      unlikely), which the fixed exploring window cannot.

    After every draft step j we minimise
    T(K)/E(K) over K ∈ [j, k_max] and draft on iff the minimum lies beyond j. The measured rule uses E(K) from
    the same per-depth acceptance, and the mean measured window time in place of T(K).
    """

    k_max: int = 16
    k_min: int = 1
    alpha: float = 0.8  # pooled per-token acceptance (EMA); the prior for depths with few observations
    ema: float = 0.3
    history: int = 64  # committed tokens of routing kept for the distinct-experts curve
    refresh_every: int = 4  # windows between curve recomputations (numpy, but not free on deep models)
    explore_every: int = 4  # every n-th window explores (0: never) ...
    explore_reach: float = 0.25  # ... while the next token is reached with at least this chance (0: to k_max)
    decay: float = 0.97  # per-window decay of the depth counts (routing and text drift)
    prior: float = 2.0  # pseudo-observations of the pooled rate at each depth
    exposure: float = 1.0  # exposed fraction of copy time (EMA over windows)
    optimism: float = 0.0  # upper-confidence bonus on acceptance at rarely-reached depths (off: see above)
    measured_after: int = 8  # windows priced before K is chosen per window from measured times (0: priced only)
    min_arm: float = 0.5  # decayed windows a K needs to count as measured (one window, for ~23 windows)
    extrapolate: bool = True  # longer K than the measured ones priced off a line through theirs
    _hist: list = field(default_factory=list, repr=False)  # per committed token: [layers] arrays of expert ids
    _curve: "np.ndarray | None" = field(default=None, repr=False)  # [k_max + 2, layers]: D_l(n), n = 0..k_max+1
    _curve_sums: list = field(default_factory=list, repr=False)  # Σ_l D_l(n), asked at every draft step
    _reach: "np.ndarray | None" = field(default=None, repr=False)  # [k_max + 1]: depth i drafted, all before accepted
    _acc: "np.ndarray | None" = field(default=None, repr=False)  # [k_max + 1]: depth i accepted
    _t_sum: "np.ndarray | None" = field(default=None, repr=False)  # [k_max + 1]: decayed Σ window seconds, by K
    _t_n: "np.ndarray | None" = field(default=None, repr=False)  # [k_max + 1]: decayed window counts, by K
    _windows: int = 0
    _side: int = 1  # the side the last exploring window tried: K + _side · s
    exploring: bool = False
    target: int | None = None  # this window's K, where the measured rule chose it at the window's start

    def __post_init__(self) -> None:
        self._reach = np.zeros(self.k_max + 1)
        self._acc = np.zeros(self.k_max + 1)
        self._t_sum = np.zeros(self.k_max + 1)
        self._t_n = np.zeros(self.k_max + 1)

    # ------------------------------------------------------------------ observations
    def new_sequence(self) -> None:
        """A new generate(): its prompt's routing replaces the token history (the curve is about consecutive
        tokens of one text); acceptance-by-depth, exposure and the measured window times carry over."""
        self._hist.clear()
        self._curve = None

    def begin_window(self) -> None:
        self._windows += 1
        self.exploring = bool(self.explore_every) and self._windows % self.explore_every == 0
        self.target = None
        if self.measured_after and self._windows > self.measured_after and self._t_n.any():
            k = self.measured_k()
            if self.exploring:
                self.target = self._neighbour(k)
            else:
                self.target = int(np.clip(k, max(self.k_min, 1), self.k_max))

    def _neighbour(self, k: int) -> int:
        """The K an exploring window tries: K − s and K + s in turn (s = max(1, K // 4)); where one falls outside
        [k_min, k_max], the other."""
        self._side = -self._side
        s, lo = max(1, k // 4), max(self.k_min, 1)
        pick = k + self._side * s if lo <= k + self._side * s <= self.k_max else k - self._side * s
        return int(np.clip(pick, lo, self.k_max))

    def update_acceptance(self, accepted: int, drafted: int) -> None:
        if drafted:
            # Per-token acceptance of a chain: `accepted` successes then at most one failure (the first
            # rejection ends the window), so the estimate is accepted / (accepted + failures), not / drafted.
            failures = 1 if accepted < drafted else 0
            rate = accepted / (accepted + failures) if accepted + failures else self.alpha
            self.alpha = (1 - self.ema) * self.alpha + self.ema * min(rate, 0.98)
            self._reach *= self.decay
            self._acc *= self.decay
            reached = min(drafted, accepted + 1, self.k_max)
            self._reach[1: reached + 1] += 1
            self._acc[1: min(accepted, self.k_max) + 1] += 1

    def observe_routing(self, per_layer: list, committed: int) -> None:
        """Feed the verification pass's routing (per layer, an int array [T, top_k] over the window's inputs);
        its first ``committed`` rows are tokens that stay in the sequence."""
        if not per_layer or committed <= 0:
            return
        for t in range(committed):
            self._hist.append([np.asarray(r[t]).reshape(-1) for r in per_layer])
        del self._hist[: max(0, len(self._hist) - self.history)]
        if self._curve is None or self._windows % self.refresh_every == 0:
            self._curve = distinct_experts_curve(self._hist, self.k_max + 1)
            self._curve_sums = [r.sum() for r in self._curve]

    def observe(self, w: "WindowOutcome") -> None:
        """Everything one finished window teaches: acceptance by depth, the committed tokens' routing, and (when
        the clock could time it) how much copy time was exposed."""
        self.update_acceptance(w.accepted, w.drafted)
        self.observe_routing(w.routing, w.accepted + 1)  # rows of `last` and the accepted drafts
        if w.stall is not None:
            self.observe_exposure(w.copies, w.stall, w.t_copy)
        if w.elapsed is not None:
            self.observe_time(w.drafted, w.elapsed)

    def observe_time(self, drafted: int, seconds: float) -> None:
        """One window of ``drafted`` draft tokens took ``seconds``, from its first draft step to its commit."""
        if drafted <= 0:
            return
        self._t_sum *= self.decay
        self._t_n *= self.decay
        k = min(drafted, self.k_max)
        self._t_sum[k] += seconds
        self._t_n[k] += 1

    def measured_k(self) -> int:
        """The K with the least measured window time per expected committed token. A K measured in at least
        ``min_arm`` decayed windows counts by its mean. With ``extrapolate`` and two or more such K, every other
        K from the shortest measured one up to ``k_max`` counts too, its time read off a line fitted through
        theirs, so the choice can jump to a long K that the measured ones point to instead of climbing there a
        neighbour at a time. (The most measured K while none has ``min_arm`` windows.)"""
        known = np.flatnonzero(self._t_n >= self.min_arm)
        if not len(known):
            return int(np.argmax(self._t_n))
        mean = self._t_sum[known] / self._t_n[known]
        ks, t = known, mean
        if self.extrapolate and len(known) >= 2:
            slope, icpt = np.polyfit(known, mean, 1, w=np.sqrt(self._t_n[known]))
            ks = np.arange(known[0], self.k_max + 1)  # not below the shortest measured K: a line says little there
            t = icpt + max(slope, 0.0) * ks  # a longer window never takes less time
            t[known - known[0]] = mean
        return int(ks[np.argmin(t / self._expected()[ks])])

    def observe_exposure(self, copies: int, stall: float, t_copy: float) -> None:
        """One finished window's copies and total stall (seconds): how much of the copy time was exposed."""
        if copies > 0 and t_copy > 0:
            x = min(max(stall / (copies * t_copy), 0.0), 1.5)
            self.exposure = (1 - self.ema) * self.exposure + self.ema * x

    # ------------------------------------------------------------------ model
    def depth_acceptance(self) -> np.ndarray:
        """α_m for m = 1..k_max (index 0 unused): per-depth counts shrunk towards the pooled rate."""
        a = (self._acc + self.prior * self.alpha) / (self._reach + self.prior)
        if self.optimism:
            a = a + self.optimism / np.sqrt(self._reach + self.prior)
        return np.clip(a, 0.0, 0.995)

    def reach_chance(self, depth: int) -> float:
        """The chance that draft token ``depth`` is reached in verification: every token before it accepted."""
        return float(np.prod(self.depth_acceptance()[1:depth]))

    def _expected(self) -> np.ndarray:
        """E[tokens](K) for K = 0..k_max: 1 + Σ_{i≤K} Π_{m≤i} α_m."""
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.depth_acceptance()[1:]))])

    def expected_tokens(self, k: int) -> float:
        return float(self._expected()[k])

    def _distinct(self, n: int) -> "np.ndarray | None":
        c = self._curve
        if c is None or len(c) <= 1:
            return None
        return c[min(n, len(c) - 1)]

    def _growth(self, j: int, k: int) -> float:
        """Σ_layers D_l(k+1) − D_l(j+1): expected new distinct experts from drafting k instead of j tokens."""
        c = self._curve
        if c is None or len(c) <= 1:
            return 0.0
        last = len(c) - 1
        return float(self._curve_sums[min(k + 1, last)] - self._curve_sums[min(j + 1, last)])

    def costs(self, j: int, t_draft: float, t_verify, t_copy: float, uncovered_now: int,
              miss_fraction: float = 1.0) -> dict[int, float]:
        """Predicted time per committed token for each K in [j, k_max]. ``t_verify``: seconds, or a function
        ``(n_tokens, distinct_per_layer or None) -> seconds``."""
        out, expected = {}, self._expected()
        for k in range(j, self.k_max + 1):
            tv = t_verify(k + 1, self._distinct(k + 1)) if callable(t_verify) else t_verify
            grown = uncovered_now + miss_fraction * self._growth(j, k)
            out[k] = (k * t_draft + tv + self.exposure * t_copy * grown) / expected[k]
        return out

    def best_k(self, j: int, t_draft: float, t_verify, t_copy: float, uncovered_now: int,
               miss_fraction: float = 1.0) -> int:
        c = self.costs(j, t_draft, t_verify, t_copy, uncovered_now, miss_fraction)
        return min(c, key=c.get)

    def keep_drafting(self, j: int, t_draft: float, t_verify, t_copy: float, uncovered_now: int,
                      miss_fraction: float = 1.0) -> bool:
        early = self.early(j)
        if early is not None:
            return early
        return self.best_k(j, t_draft, t_verify, t_copy, uncovered_now, miss_fraction) > j

    def early(self, j: int) -> bool | None:
        """Whether to draft a token after draft step j when no cost is needed to say (below K_min, at K_max,
        exploring, nothing seen yet); None when the costs decide."""
        if j < self.k_min:
            return True
        if j >= self.k_max:
            return False
        if self.target is not None:
            return j < self.target
        if self.exploring:
            return self.reach_chance(j + 1) >= self.explore_reach
        if self._curve is None:  # no routing seen yet (no prompt routing either): the paper's K=8
            return j < min(8, self.k_max)
        return None


def distinct_experts_curve(history: list, n_max: int) -> np.ndarray:
    """``D[n, l]``: mean number of distinct experts that n consecutive tokens of ``history`` route to in layer l
    (n = 0..n_max; windows longer than the history reuse the longest measured value). ``history`` is a list of
    tokens, each a list over layers of expert-id arrays."""
    H = len(history)
    if H == 0:
        return np.zeros((1, 0))
    L = len(history[0])
    try:
        ids = np.array(history)  # [H, L, k] when every layer routes the same k (one C loop, not H × L)
    except ValueError:
        ids = None
    uniform = ids is not None and ids.ndim == 3
    E = 1 + (int(ids.max()) if uniform and ids.size else max(int(a.max()) for tok in history for a in tok if a.size))
    onehot = np.zeros((H, L, E + 1), dtype=bool)  # column E catches -1: a slot an imported trace did not record
    if uniform:
        onehot[np.arange(H)[:, None, None], np.arange(L)[None, :, None], np.where(ids >= 0, ids, E)] = True
    else:
        for t, tok in enumerate(history):
            for layer, row in enumerate(tok):
                onehot[t, layer, row[row >= 0]] = True
    onehot = onehot[:, :, :E]
    curve = np.zeros((n_max + 1, L))
    cur = onehot.copy()  # cur[s] = union of tokens s .. s+n-1
    for n in range(1, n_max + 1):
        if n > H:
            curve[n] = curve[n - 1]
            continue
        if n > 1:
            cur = cur[:-1] | onehot[n - 1:]
        curve[n] = cur.sum(-1).mean(0)
    return curve
