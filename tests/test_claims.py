"""tools/claims.py: §8's claim-by-claim reading on hand-made summaries (8 held-out games a run: 4 seen, 4 unseen),
worked by hand (tests/test_blocks.py checks the docs' claims blocks against its output)."""
from tools.claims import claims


def summary(seed, won, sampled=None, rollouts=64.0):
    """won (greedy) and sampled (default: the same) of the 8 held-out games at the run's last step."""
    def split(w, n=4):
        return {"won": w, "n": n, "per_type": {"p": [w, n]}}
    s = won if sampled is None else sampled
    counts = {"test_seen": split(min(won, 4)), "test_unseen": split(won - min(won, 4)),
              "test_seen_sampled": split(min(s, 4)), "test_unseen_sampled": split(s - min(s, 4))}
    return {"cfg": {"seed": seed}, "final": {"counts": counts}, "rollouts_per_step": rollouts}


def runs(won, **kw):
    return {k: summary(k, w, **kw) for k, w in enumerate(won)}


def rows(out):
    """{comparison: (numbers, reading, beside)} of claims()'s table."""
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in out[2:]]
    return {c[1]: (c[2], c[3], c[4]) for c in cells}


def test_each_claim_by_hand():
    """Agent-G² wins 2 of 8 on every seed (25 %).
    GRPO 3, 4, 3, 4, 3 -> Agent-G² − GRPO -12.5, -25, -12.5, -25, -12.5: mean -17.5, sd 6.85, half width
    2.776 * 6.85 / sqrt 5 = 8.5 -> [-26.0, -9.0], wholly below 0: reversed. Sampled GRPO 2 on every seed: +0.0.
    fixed 2, 1, 3 -> 0, +12.5, -12.5: mean 0, sd 12.5, half 4.303 * 12.5 / sqrt 3 = 31.1 -> [-31.1, +31.1]:
    not shown. linear 0, 1, 0 -> +25, +12.5, +25: mean 20.8, sd 7.22, half 17.9 -> [+2.9, +38.8]: shown.
    target-acc has 2 of its 3 seeds: runs missing.
    binary 3, 3, 2 -> binary − Agent-G² +12.5, +12.5, 0: mean 8.3 -> [-9.6, +26.3], not wholly above 0: shown;
    detectable (t_0.975 + t_0.8 at 2 df) sd / sqrt 3 = (4.303 + 1.061) * 7.217 / 1.732 = 22.348 -> 22.3; rollouts 64
    against 120: 0.53×.
    σ = 0 (no_sampling) wins 2, 2, 2 -> 0 on every seed: no spread for an interval ([—]): "no spread"; uniform
    3, 3, 3 -> -12.5 on every seed: the same.
    The band: σ 0.25 (within 0.05 of 0.22) and R² 0.90 -> shown; σ 0.27 (0.05 off: within) -> shown; σ 0.28 or
    R² 0.84 -> not shown.
    Then binary 4, 4, 3 -> +25, +25, +12.5: mean 20.8 -> [+2.9, +38.8] (as linear, mirrored), wholly above 0:
    reversed."""
    r = {"g2": runs([2] * 5), "grpo": runs([3, 4, 3, 4, 3], sampled=2), "fixed": runs([2, 1, 3]),
         "linear": runs([0, 1, 0]), "target_acc": runs([2, 2]), "binary": runs([3, 3, 2], rollouts=120.0),
         "no_sampling": runs([2, 2, 2]), "uniform": runs([3, 3, 3])}
    got = rows(claims(r, {"checkpoint": "ckpt", "fit": {"sigma": 0.25, "r2": 0.90}}))
    assert got["Agent-G² − GRPO"] == ("-17.5 [-26.0, -9.0] (5 seeds)", "**reversed**",
                                      "sampled +0.0 [—] (5 seeds)")
    assert got["Agent-G² − fixed ratio 0.5"][:2] == ("+0.0 [-31.1, +31.1] (3 seeds)", "**not shown**")
    assert got["Agent-G² − linear decay"][:2] == ("+20.8 [+2.9, +38.8] (3 seeds)", "**shown**")
    assert got["Agent-G² − target-acc"][1] == "runs missing (2 of 3 seeds)"
    assert got["binary search (probe) − Agent-G²"] == (
        "+8.3 [-9.6, +26.3] (3 seeds)", "**shown**: no difference found",
        "sampled +8.3 [-9.6, +26.3] (3 seeds); detectable 22.3; rollouts a step 64.0 against 120.0 (0.53×)")
    assert got["Agent-G² − σ = 0 (no sampling)"][:2] == ("+0.0 [—] (3 seeds)", "no spread")
    assert got["Agent-G² − uniform sampling"][:2] == ("-12.5 [—] (3 seeds)", "no spread")
    assert got["Agent-G² − K = 1"] == ("no runs yet", "runs missing (0 of 3 seeds)", "sampled no runs yet")
    assert got["the diagnostic of ckpt"] == ("σ 0.250, R² 0.900", "**shown**", "")
    r["binary"] = runs([4, 4, 3], rollouts=120.0)
    got = rows(claims(r, {"checkpoint": "ckpt", "fit": {"sigma": 0.27, "r2": 0.85}}))
    assert got["binary search (probe) − Agent-G²"][:2] == ("+20.8 [+2.9, +38.8] (3 seeds)", "**reversed**")
    assert got["the diagnostic of ckpt"][1] == "**shown**"
    for fit in ({"sigma": 0.28, "r2": 0.90}, {"sigma": 0.22, "r2": 0.84}):
        assert rows(claims(r, {"checkpoint": "ckpt", "fit": fit}))["the diagnostic of ckpt"][1] == "**not shown**"
    assert rows(claims(r))["the diagnostic"] == ("no diagnostic given", "", "")
