"""tools/why.py: §9's verdicts from hand-made summaries (4 seen + 4 unseen held-out games a run), worked by hand
(tests/test_blocks.py checks the docs' why blocks against its output)."""
from tools.why import verdicts


def summary(seed, seen, unseen, train=None, first=None):
    """A run's summary: greedy won of 4 seen and 4 unseen games at its last step (train: won of 40 training-panel
    games); first: (seen, unseen, train) at step 0."""
    def ev(se, un, tr):
        counts = {"test_seen": {"won": se, "n": 4, "per_type": {"p": [se, 4]}},
                  "test_unseen": {"won": un, "n": 4, "per_type": {"p": [un, 4]}}}
        if tr is not None:
            counts["train_panel"] = {"won": tr, "n": 40, "per_type": {"p": [tr, 40]}}
        return {"counts": counts}
    return {"cfg": {"seed": seed}, "final": ev(seen, unseen, train), "grad_norm": 0.1,
            "evals": [{"step": 0, "eval": ev(*first)}] if first else []}


def runs(pairs, **kw):
    return {k: summary(k, se, un, **({"train": kw["train"][k], "first": kw["first"]} if kw else {}))
            for k, (se, un) in pairs.items()}


def test_each_verdict_by_hand():
    """(a) before: 2 / 8 on every seed; after: 3, 4, 3, 4, 3 of 8 -> differences 12.5, 25, 12.5, 25, 12.5: mean 17.5,
    sd 6.85, half width 2.776 * 6.85 / sqrt 5 = 8.5 -> [+9.0, +26.0], wholly above 0: supported.
    (b) seen: GRPO 3 / 4 = 75 %, Agent-G² 2 / 4 = 50 % -> G = 25; hint_free 4, 3, 4 of 4 -> 50, 25, 50: mean 41.7,
    sd 14.4, half 4.303 * 14.4 / sqrt 3 = 35.9 -> [+5.8, +77.5] above 0, and 91.7 >= 50 + 12.5: supported.
    (c) training panel 10 / 40 at step 0, then 20, 22, 18 of 40 -> +25, +30, +20: [+12.6, +37.4]; held-out 4 / 8 at
    step 0, then 2, 1, 2 of 8 -> -25, -37.5, -25: mean -29.2, half 17.9 -> upper end -11.2 < 0: supported.
    (d) at 150 steps Agent-G² − GRPO: 37.5, 50, 37.5 against 62.5 -> negative; at 300 steps 75 against 50 on every
    seed: +25 [+25, +25], wholly above 0, the other side: supported. Then the refuted cases: Agent-G² unchanged
    by the fix (0 on every seed: upper end 0 < 2.6) and hint_free equal to Agent-G² (mean 0)."""
    pre = {"g2": runs({k: (1, 1) for k in range(5)})}
    post = {"g2": runs({0: (2, 1), 1: (2, 2), 2: (2, 1), 3: (2, 2), 4: (2, 1)}),
            "grpo": runs({k: (3, 2) for k in range(3)})}
    why = {"hint_free": runs({0: (4, 0), 1: (3, 0), 2: (4, 0)}),
           "aux_only": runs({0: (1, 1), 1: (1, 0), 2: (1, 1)}, train={0: 20, 1: 22, 2: 18}, first=(2, 2, 10)),
           "g2_300": runs({k: (3, 3) for k in range(3)}), "grpo_300": runs({k: (2, 2) for k in range(3)})}
    got = {name[:3]: (nums + more, v) for name, nums, more, v in verdicts(pre, post, why)}
    assert got["(a)"][1] == "supported" and "after − before +17.5 [+9.0, +26.0] (5 seeds)" in got["(a)"][0]
    assert got["(b)"][1] == "supported" and "G = +25.0" in got["(b)"][0]
    assert "hint_free − Agent-G² +41.7 [+5.8, +77.5] (3 seeds)" in got["(b)"][0]
    assert got["(c)"][1] == "supported" and "training panel +25.0 [+12.6, +37.4]" in got["(c)"][0]
    assert "held-out -29.2 [-47.1, -11.2]" in got["(c)"][0]
    assert got["(d)"][1] == "supported" and "at 300 steps +25.0 [+25.0, +25.0]" in got["(d)"][0]
    assert "fixed no runs yet; linear no runs yet" in got["(a)"][0]  # rows with no seeds say so, not nan
    pre["fixed"], post["fixed"] = runs({0: (1, 1)}), runs({0: (2, 1)})
    assert "fixed +12.5 (1 seed); linear" in verdicts(pre, post, why)[0][2]  # 3/8 - 2/8: no interval from one
    post["g2"] = runs({k: (1, 1) for k in range(5)})
    why["hint_free"] = runs({k: (1, 1) for k in range(3)})
    got = {name[:3]: v for name, _, _, v in verdicts(pre, post, why)}
    assert got["(a)"] == "refuted" and got["(b)"] == "refuted"
    # hint_free about Agent-G²'s 1 / 4 on seen rooms: 0, 1, 2 of 4 -> -25, 0, +25, mean 0 (refuted by the rule),
    # sd 25, half 4.303 * 25 / sqrt 3 = 62.1: the interval [-62.1, +62.1] holds the predicted G / 2 = (75 - 25) / 2
    why["hint_free"] = runs({0: (0, 1), 1: (1, 1), 2: (2, 1)})
    got = {name[:3]: v for name, _, _, v in verdicts(pre, post, why)}
    assert got["(b)"] == "refuted by the rule's mean, though its interval holds the predicted +25.0"
    assert verdicts(pre, {}, {})[0][3] == "runs missing"


def test_the_runs_table_by_hand():
    """Three runs of §9 and one kept row: the kept one is left out; starts are date - wall (02:57 - 58 min =
    01:59:00; 23:41 - 22.5 min = 23:18:30; 05:50 - 37.5 min = 05:12:30, resumed: marked); the total 118
    min."""
    from tools.why import runs_table
    post = {"g2": {0: {"git_commit": "8d795fa", "date": "2026-12-04 23:41 UTC", "wall_s": 1350.0}},
            "grpo": {0: {"git_commit": "cc749d5", "date": "2026-12-03 10:00 UTC", "wall_s": 900.0}}}
    why = {"hint_free": {1: {"git_commit": "e615e3d", "date": "2026-12-05 02:57 UTC", "wall_s": 3480.0}},
           "aux_only": {0: {"git_commit": "e615e3d", "date": "2026-12-05 05:50 UTC", "wall_s": 2250.0,
                            "cfg": {"resume": "auto"}}}}
    assert runs_table(post, why) == [
        "| run | commit | start (UTC, within a minute after) | wall (min) |", "|---|---|---|---:|",
        "| mix6/g2/s0 | 8d795fa | 2026-12-04 23:18:30 | 22.5 |",
        "| why/hint_free/s1 | e615e3d | 2026-12-05 01:59:00 | 58.0 |",
        "| why/aux_only/s0 | e615e3d | 2026-12-05 05:12:30 (resumed: began earlier) | 37.5 |",
        "| all 3 runs | | | 118.0 |"]
