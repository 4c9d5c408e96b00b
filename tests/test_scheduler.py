"""Unit tests for every scheduler formula (docs/method.md §2-§4). Pure numpy, runs in a second."""
import dataclasses
import json
import math

import numpy as np
import pytest

from config import Config
from scheduler import make_rule, prefix_len
from variants.rules import balanced_thresholds, cluster_ids, token_offsets, token_prefix_len


def cfg(**kw):
    return dataclasses.replace(Config(), **kw)


def tasks_of(lengths):
    return [{"id": f"t{i}", "L": L} for i, L in enumerate(lengths)]


def make(lengths=(3, 5, 7, 9, 11, 13), seed=0, **kw):
    c = cfg(**kw)
    return make_rule(c, [f"t{i}" for i in range(len(lengths))], list(lengths), seed=seed)


def test_prefix_len_bounds():
    assert prefix_len(0.0, 5) == 0
    assert prefix_len(1.0, 5) == 4  # never L: the policy always takes the last step
    assert prefix_len(0.3, 10) == 3  # float guard: 0.3*10 = 3.0000000000000004
    assert prefix_len(0.31, 10) == 4
    assert prefix_len(0.5, 1) == 0
    for r in np.linspace(0, 1, 101):
        for L in range(1, 16):
            assert 0 <= prefix_len(r, L) <= L - 1
    with pytest.raises(ValueError, match="L must be >= 1"):
        prefix_len(0.5, 0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        prefix_len(1.5, 4)


def test_prefix_len_token_mode_rounds_up_to_step():
    tok_cum = [10, 12, 40, 45]  # step lengths 10, 2, 28, 5 -> total 45
    assert token_prefix_len(0.0, 4, tok_cum) == 0
    assert token_prefix_len(0.2, 4, tok_cum) == 1  # floor(9) = 9 tokens -> first step end reaching it is 10
    assert token_prefix_len(0.3, 4, tok_cum) == 3  # floor(13.5) = 13 tokens -> needs 3 steps (40); action units: 2
    assert prefix_len(0.3, 4) == 2
    assert token_prefix_len(1.0, 4, tok_cum) == 3


class CharTok:
    """A tokenizer with one token per character, so token counts are string lengths."""
    def encode(self, text, add_special_tokens=True):
        return list(text)


def test_token_offsets_encode_the_joined_prefix():
    # "Step 1: go" = 10 chars; "Step 2: take key" = 16; "Step 3: open door" = 17. Joined by "\n", no final newline:
    # 10, 10 + 1 + 16 = 27, 27 + 1 + 17 = 45 (per-line counts with a "\n" after each line would give 11, 28, 46)
    assert token_offsets(CharTok(), ["go", "take key", "open door"]) == [10, 27, 45]
    assert token_offsets(CharTok(), [" go ", "take key\n", "open door"]) == [10, 27, 45]  # stripped, as theirs
    assert token_offsets(CharTok(), ["go"]) == [10]


def test_prefix_len_token_units_released_rule():
    off = [10, 27, 45]  # L = 3
    assert token_prefix_len(0.5, 3, off) == 2  # target floor(22.5) = 22 -> first end >= 22 is 27 (step 2)
    assert token_prefix_len(0.25, 3, off) == 2  # floor(11.25) = 11 -> 27
    assert token_prefix_len(0.02, 3, off) == 0  # floor(0.9) = 0 tokens -> no prefix (rounding up would give step 1)
    assert token_prefix_len(1.0, 3, off) == 2  # 45 >= total -> all 3 steps, capped at L - 1 = 2
    assert token_prefix_len(0.5, 3, off, max_steps=2) == 1  # cap min(L - 1, max_steps - 1) = min(2, 1) = 1
    assert token_prefix_len(0.5, 3, off, max_steps=20) == 2
    assert token_prefix_len(0.5, 3, off, max_steps=1) == 0  # min(2, 0) = 0
    # floor, not the exact product: 20 * 0.52 = 10.4 -> 10 tokens -> step 1 already ends at 10 (10.4 would need 2)
    assert token_prefix_len(0.52, 3, [10, 11, 20]) == 1
    assert token_prefix_len(0.25, 3, [10, 20, 40]) == 1  # floor(10) = 10: step 1 ends exactly there
    with pytest.raises(ValueError, match="tok_cum has 2 entries"):
        token_prefix_len(0.5, 3, [10, 20])


def test_token_depths_cap_at_max_steps():
    # fixed ratio 1.0, offsets [10, 27, 45]: all 3 steps -> capped at min(L - 1, max_steps - 1)
    t = [{"id": "t0", "L": 3, "tok_cum": [10, 27, 45]}]
    assert make(lengths=(3,), scheduler="fixed", fixed_ratio=1.0, prefix_unit="token", max_steps=50) \
        .depths(t, 0)["n"] == [2]
    assert make(lengths=(3,), scheduler="fixed", fixed_ratio=1.0, prefix_unit="token", max_steps=2) \
        .depths(t, 0)["n"] == [1]
    assert make(lengths=(3,), scheduler="fixed", fixed_ratio=0.5, prefix_unit="token", max_steps=50) \
        .depths(t, 0)["n"] == [2]  # floor(22.5) = 22 -> step 2


def test_mu_global_sign_update_and_clip():
    s = make()
    ids = ["t0", "t1"]
    s.update(ids, [0.0, 0.25])  # acc 0.125 < 0.5 -> deeper guidance
    assert s.mu_global == pytest.approx(0.9)
    s.update(ids, [0.0, 0.0])
    s.update(ids, [0.0, 0.0])
    assert s.mu_global == 1.0  # clipped at 1
    s.update(ids, [0.5, 0.5])  # sign(0) = 0: no move
    assert s.mu_global == 1.0
    for _ in range(15):
        s.update(ids, [1.0, 1.0])
    assert s.mu_global == 0.0


def test_mu_global_deadband_and_proportional():
    s = make(mu_update="deadband", acc_low=0.4, acc_high=0.6, cap=0.8)
    assert s.mu_global == 0.8
    s.update(["t0"], [0.5])
    assert s.mu_global == 0.8
    s.update(["t0"], [0.3])
    assert s.mu_global == 0.8  # capped at 0.8
    s.update(["t0"], [0.7])
    assert s.mu_global == pytest.approx(0.7)
    p = make(mu_update="proportional", kp=0.5)
    p.update(["t0"], [0.1])
    assert p.mu_global == pytest.approx(0.8 + 0.5 * 0.4 if 0.8 + 0.2 <= 1 else 1.0)


def test_ema_only_clusters_in_batch_move():
    s = make(lengths=(3, 3, 8, 8, 14, 14), K=3, alpha=0.2)
    assert [s.cluster[f"t{i}"] for i in range(6)] == [0, 0, 1, 1, 2, 2]
    s.update(["t0", "t1"], [0.25, 0.75])
    assert s.A.tolist() == pytest.approx([0.2 * 0.5, 0, 0])
    assert s.V.tolist() == pytest.approx([0.2 * 0.0625, 0, 0])
    s.update(["t0", "t4"], [1.0, 0.5])
    assert s.A[0] == pytest.approx(0.8 * 0.1 + 0.2 * 1.0)
    assert s.A[1] == 0 and s.V[1] == 0
    assert s.A[2] == pytest.approx(0.1)
    assert s.V[0] == pytest.approx(0.8 * 0.0125)  # one task: variance 0


def test_traj_level_stats():
    s = make(lengths=(3, 3), K=1, stats_level="traj", alpha=1.0)
    s.update(["t0", "t1"], [0.5, 1.0], flags=[[1, 0], [1, 1]])
    assert s.A[0] == pytest.approx(0.75)
    assert s.V[0] == pytest.approx(0.75 * 0.25)


def test_batch_accuracy_over_trajectories():
    # [released] --stats_level traj: task t0: 6 kept episodes all won, t1: 2 kept, both lost. Task means 1.0 and 0.0
    # -> 0.5 (inside the 0.4-0.6 dead band: no move); trajectories 6 / 8 = 0.75 > 0.6 -> mu_global 0.8 - 0.1 = 0.7
    s = make(lengths=(3, 3), K=1, mu_update="deadband", acc_low=0.4, acc_high=0.6, cap=0.8, stats_level="traj")
    s.update(["t0", "t1"], [1.0, 0.0], flags=[[1] * 6, [0, 0]])
    assert s.mu_global == pytest.approx(0.7)
    t = make(lengths=(3, 3), K=1, mu_update="deadband", acc_low=0.4, acc_high=0.6, cap=0.8)
    t.update(["t0", "t1"], [1.0, 0.0])  # no flags: mean of task means 0.5 -> no move
    assert t.mu_global == pytest.approx(0.8)


def test_the_papers_batch_accuracy_is_the_mean_of_task_means():
    """The paper's acc_B = mean_i p_i (docs/method.md §2 step 5), also when an error leaves a task fewer kept episodes
    than another: t0 kept 6 episodes, all won (p 1.0); t1 kept 2 of its 6 (4 lost to env errors), both lost (p 0.0).
    acc_B = (1.0 + 0.0) / 2 = 0.5 = p_target: sign 0, mu_global stays 0.8. Over the trajectories, as the authors'
    code averages them (--stats_level traj), it would be 6 / 8 = 0.75 > 0.5 and mu_global would fall to 0.7."""
    s = make(lengths=(3, 3), K=1)
    assert type(s).__name__ == "G2" and s.mu_global == pytest.approx(0.8)
    s.update(["t0", "t1"], [1.0, 0.0], flags=[[1] * 6, [0, 0]])
    assert s.mu_global == pytest.approx(0.8)
    traj = make(lengths=(3, 3), K=1, stats_level="traj")
    traj.update(["t0", "t1"], [1.0, 0.0], flags=[[1] * 6, [0, 0]])
    assert traj.mu_global == pytest.approx(0.7)


def test_a_redraw_draws_again_only_the_tasks_over_the_step_budget():
    """train.py's draw_depths with a rule that answers 3 scripted plans, --max_steps 8: the first plan puts task 1
    at 9 (>= 8: no step left to the policy), the second at 9 again, the third at 4. Tasks 0 and 2 keep their first
    draws (1 and 2), not the later 3 / 5 and 1 / 7; two re-draws; the probe rollouts of every draw add up."""
    from types import SimpleNamespace
    from train_update import train_function
    plans = [[1, 9, 2], [3, 9, 1], [5, 4, 7]]
    rule = SimpleNamespace(depths=lambda view, step, probe: {"n": list(plans.pop(0)), "r": [0.1, 0.2, 0.3],
                                                              "probe_rollouts": 1})
    draw = train_function("draw_depths", {"rule": rule, "cfg": cfg(max_steps=8),
                                           "player": SimpleNamespace(plays=True)})
    plan, tries = draw([{}] * 3, 0, None)
    assert plan["n"] == [1, 4, 2] and tries == 2 and plan["probe_rollouts"] == 3
    fixed = SimpleNamespace(depths=lambda view, step, probe: {"n": [1, 9], "r": [0.1, 0.9], "probe_rollouts": 0})
    draw = train_function("draw_depths", {"rule": fixed, "cfg": cfg(max_steps=8),
                                           "player": SimpleNamespace(plays=True)})
    assert draw([{}] * 2, 0, None) == ({"n": [1, 9], "r": [0.1, 0.9], "probe_rollouts": 0}, 10)  # bounded


@pytest.mark.parametrize("level", ["task", "traj"])
@pytest.mark.parametrize("missing", [None, 0.0])  # None: the interface; 0.0: a stand-in a caller might pass
def test_task_with_every_episode_errored_changes_nothing(level, missing):
    # clusters: lengths 3, 3 -> 0; 8, 8 -> 1 (median 5.5). t0 (cluster 0) kept [1, 0]; t2 (cluster 1): every episode
    # errored, flags []. alpha 0.2: cluster 0 gets A = 0.2 * 0.5 = 0.1 and V = 0.2 * var, var = 0.25 over the two
    # trajectories (traj) or 0 over the one task mean (task); cluster 1 keeps A = 0.3, V = 0.02; acc_B = 0.5 ->
    # sign(0.5 - 0.5) = 0: mu_global stays 0.8 (counting t2 as 0.0 would give 0.25 and move it to 0.9)
    # (online clusters that never re-cluster: the rule that keeps last_p and succ, the variants' statistics)
    s = make(lengths=(3, 3, 8, 8), K=2, alpha=0.2, stats_level=level, cluster_mode="online", recluster_every=1000)
    s.A[1], s.V[1] = 0.3, 0.02
    s.last_p["t2"] = s.succ["t2"] = 0.25
    s.update(["t0", "t2"], [0.5, missing], flags=[[1, 0], []])
    assert s.mu_global == pytest.approx(0.8)
    assert s.A.tolist() == pytest.approx([0.1, 0.3])
    assert s.V.tolist() == pytest.approx([0.2 * 0.25 if level == "traj" else 0.0, 0.02])
    assert s.last_p == {"t2": 0.25, "t0": 0.5} and s.succ == {"t2": 0.25, "t0": 0.5}
    plan = s.depths(tasks_of([3, 3, 8, 8]), 1)  # no NaN reaches prefix_len
    assert all(0 <= n < L for n, L in zip(plan["n"], [3, 3, 8, 8]))
    # a batch where every task errored: nothing moves (nor the target-acc counter)
    before = json.dumps(s.state_dict(), sort_keys=True)
    s.update(["t2", "t3"], [missing, missing], flags=[[], []])
    assert json.dumps(s.state_dict(), sort_keys=True) == before
    if missing is None:  # without flags, None alone marks the task
        s.update(["t0", "t2"], [0.5, None])
        assert s.A[1] == pytest.approx(0.3) and s.mu_global == pytest.approx(0.8)


def test_update_rejects_flags_without_p_hat():
    s = make(stats_level="traj")
    with pytest.raises(ValueError, match="p_hat is None but it has trajectory flags"):
        s.update(["t0"], [None], flags=[[1, 0]])
    with pytest.raises(ValueError, match="one list of trajectory flags per task"):
        s.update(["t0", "t1"], [0.5, 0.5], flags=[[1, 0]])


def test_released_presets_per_environment():
    # The launchers at commit e065918 (the ones that match the paper's method): ALFWorld adds dynamic sigma, the band
    # 0.5 / 0.5 and prefix SFT at 0.5 to the yaml; WebShop also 15 steps, 150 epochs, mini-batches of 64, webshop_3
    from config import get_config
    a, w = get_config(["--preset", "released"]), get_config(["--preset", "released_webshop"])
    assert (a.env, a.acc_low, a.acc_high, a.max_steps, a.K, a.sigma_mode, a.eta, a.aux_agg, a.ppo_mini_batch) == \
        ("alfworld", 0.5, 0.5, 20, 5, "dynamic", 0.5, "prefix-mean", 256)
    assert (w.env, w.acc_low, w.acc_high, w.max_steps, w.K, w.sigma_mode, w.steps, w.ppo_mini_batch, w.eta) == \
        ("webshop", 0.5, 0.5, 15, 3, "dynamic", 150, 64, 0.5)
    assert (w.lam, w.cap, w.mu_update, w.stats_level, w.prefix_unit, w.cluster_mode, w.reward_scale) == \
        (0.3, 0.8, "deadband", "traj", "token", "webshop_3", 10.0)
    # the other stored launcher (1df588): the yaml's band, a fixed sigma, no prefix SFT
    old = get_config(["--preset", "released", "--sigma_mode", "fixed", "--acc_low", "0.4", "--acc_high", "0.6",
                      "--eta", "0"])
    assert (old.sigma_mode, old.sigma_fixed, old.acc_low, old.acc_high, old.eta) == ("fixed", 0.25, 0.4, 0.6, 0.0)
    assert w.out_dir == "runs/released_webshop" and w.preset == "released_webshop"
    s = make_rule(w, ["t0", "t1"], [3, 3])
    s.update(["t0", "t1"], [0.5, 0.375], flags=[[1, 0] * 4, [1, 1, 1, 0, 0, 0, 0, 0]])  # 7 / 16 < 0.5: deeper
    assert s.mu_global == pytest.approx(0.8)  # mu0 0.8 + 0.1, capped at 0.8
    s.update(["t0"], [0.625], flags=[[1, 1, 1, 1, 1, 0, 0, 0]])  # 5 / 8 > 0.5 -> 0.7 (0.4 / 0.6 would not move)
    assert s.mu_global == pytest.approx(0.7)


def test_mu_i_sigma_i_and_sigma_min():
    s = make(lengths=(3, 8, 14), K=3, lam=1.0, gamma=1.0, sigma_min=0.1)
    s.mu_global, s.A[:], s.V[:] = 0.6, [0.9, 0.5, 0.1], [0.05, 0.2, 0.3]
    assert s.mu_sigma(0) == pytest.approx((0.2, 0.1))  # sigma_min floor
    assert s.mu_sigma(1) == pytest.approx((0.6, 0.2))
    assert s.mu_sigma(2) == pytest.approx((1.0, 0.3))  # clip(0.6 + 0.4) = 1.0
    r = make(lengths=(3,), K=1, lam=0.3, cap=0.8, sigma_mode="fixed", sigma_fixed=0.25)
    r.A[0] = 0.0
    assert r.mu_sigma(0) == pytest.approx((0.8, 0.25))  # min(0.8 + 0.15, cap 0.8)
    z = make(lengths=(3,), K=1, lam=0.0)
    z.A[0] = 0.0
    assert z.mu_sigma(0)[0] == pytest.approx(0.8)  # no adaptive centre


def test_sampling_modes_distribution():
    for mode, check in [("gaussian", lambda x: abs(x.std() - 0.1) < 0.01),
                        ("uniform", lambda x: abs(x.std() - 0.1) < 0.01 and x.max() <= 0.5 + math.sqrt(3) * 0.1),
                        ("none", lambda x: np.all(x == 0.5))]:
        s = make(lengths=(3,), K=1, sampling=mode, mu0=0.5, lam=0.0)
        x = np.array([s.draw(*s.mu_sigma(0)) for _ in range(4000)])
        assert abs(x.mean() - 0.5) < 0.01 and check(x), mode


def test_sampled_ratio_clipped_to_cap():
    s = make(lengths=(10,), K=1, cap=0.8, mu0=0.8, sigma_mode="fixed", sigma_fixed=0.5)
    x = np.array([s.draw(*s.mu_sigma(0)) for _ in range(2000)])
    assert x.max() <= 0.8 and x.min() >= 0.0


def test_baseline_depths():
    L = [10, 4]
    T = 11
    at = lambda name, step, **kw: make(lengths=L, scheduler=name, steps=T, **kw).depths(tasks_of(L), step)["n"]
    assert at("none", 5) == [0, 0]
    assert at("fixed", 0, fixed_ratio=0.5) == [5, 2]
    assert at("linear", 0) == [9, 3]  # r = 1 -> L - 1
    assert at("linear", 5) == [5, 2]  # r = 0.5
    assert at("linear", 10) == [0, 0]
    assert at("cosine", 5) == [prefix_len(math.cos(math.pi / 4), 10), prefix_len(math.cos(math.pi / 4), 4)]
    assert at("cosine", 10) == [0, 0]
    assert at("step", 0, step_every=50) == [9, 3]
    assert at("step", 120, step_every=50) == [7, 1]
    assert at("step", 500, step_every=50) == [0, 0]
    ta = make(lengths=L, scheduler="target_acc")
    assert ta.depths(tasks_of(L), 0)["n"] == [9, 3]
    ta.update(["t0", "t1"], [0.5, 0.5])
    ta.update(["t0", "t1"], [0.0, 0.25])  # < 0.5: d does not grow
    ta.update(["t0", "t1"], [1.0, 0.0])
    assert ta.d == 2 and ta.depths(tasks_of(L), 3)["n"] == [7, 1]


def scripted_probe(curves, R=8, log=None):
    """curves[i](n) -> successes of task i at depth n."""
    def probe(pairs):
        if log is not None:
            log.extend(pairs)
        return [curves[i](n) for i, n in pairs]
    return probe


def test_binary_search_on_scripted_curves():
    # task 0: successes = n (so 4 at depth 4), L = 10 -> probes 4 (mid of [0, 9]) -> exact, stop
    # task 1: always 0 -> probes 4, then 7 (M = 2 spent) -> picks closer to 4: both 0 -> shallower 4
    # task 2: successes 8 at every depth -> 4, then 1 -> tie -> 1
    log = []
    s = make(lengths=(10, 10, 10), scheduler="binary", max_probes=2, group_size=8)
    plan = s.depths(tasks_of([10, 10, 10]), 0, scripted_probe([lambda n: n, lambda n: 0, lambda n: 8], log=log))
    assert plan["n"] == [4, 4, 1]
    assert sorted(log) == [(0, 4), (1, 4), (1, 7), (2, 1), (2, 4)]
    assert plan["probe_rollouts"] == 2 * 8  # tasks 1 and 2 spent one extra group each
    s3 = make(lengths=(10,), scheduler="binary", max_probes=5)
    plan = s3.depths(tasks_of([10]), 0, scripted_probe([lambda n: 2 * n - 8]))  # 4 successes at n = 6
    assert plan["n"] == [6] and plan["probe_rollouts"] == 8 * 3  # probes 4 (0), 7 (6), 5 (2), 6 (4): 3 extra groups


def test_binary_respects_max_steps():
    log = []
    s = make(lengths=(30,), scheduler="binary", max_probes=10, max_steps=9)
    s.depths(tasks_of([30]), 0, scripted_probe([lambda n: 0], log=log))
    assert max(n for _, n in log) <= 8


def test_enumeration_every_depth_and_grid():
    log = []
    s = make(lengths=(5, 3), scheduler="enum")
    plan = s.depths(tasks_of([5, 3]), 0, scripted_probe([lambda n: 2 * n, lambda n: 8 - n], log=log))
    assert plan["n"] == [2, 2]  # task 0: 4 successes at n = 2; task 1: 8, 7, 6 -> 6 (n = 2) is closest to 4
    assert len(log) == 5 + 3 and plan["probe_rollouts"] == (8 - 2) * 8
    g = make(lengths=(10,), scheduler="enum", enum_grid=0.5)
    plan = g.depths(tasks_of([10]), 0, scripted_probe([lambda n: n]))
    assert plan["probe_rollouts"] == 2 * 8  # grid {0, 5, 9}


def test_hybrid_probe_counts_only_degenerate_tasks():
    s = make(lengths=(10, 10, 10), scheduler="g2", hybrid_probe=True, mu0=0.5, lam=0.0, sampling="none")
    s.update(["t0", "t1", "t2"], [0.0, 0.5, 1.0])  # mu_global stays 0.5 (acc = 0.5)
    log = []
    plan = s.depths(tasks_of([10, 10, 10]), 1, scripted_probe([lambda n: 0, lambda n: 4, lambda n: 5], log=log))
    assert sorted(i for i, _ in log) == [0, 2]  # only the all-0 / all-1 tasks probe
    assert plan["n"][0] > 5 and plan["n"][2] == 5  # task 0 moved deeper; task 2's probe was in band
    assert plan["probe_rollouts"] == 8


def test_same_seed_same_output_and_state_roundtrip():
    L = [3, 5, 7, 9, 11, 13, 6, 8]
    a, b = make(lengths=L, seed=7), make(lengths=L, seed=7)
    for step in range(5):
        pa, pb = a.depths(tasks_of(L), step), b.depths(tasks_of(L), step)
        assert pa == pb
        p = np.random.default_rng(step).uniform(size=len(L)).round(3)
        a.update([t["id"] for t in tasks_of(L)], p)
        b.update([t["id"] for t in tasks_of(L)], p)
    sd = json.loads(json.dumps(a.state_dict()))  # must survive JSON (checkpoints)
    c = make(lengths=L, seed=123)
    c.load_state_dict(sd)
    for step in range(5, 9):
        assert a.depths(tasks_of(L), step) == c.depths(tasks_of(L), step)
    assert a.stats() == c.stats()


def test_webshop_3_clusters_by_hand():
    """The authors' WebShop groups: expert length <= 4 | 5 | >= 6 (thresholds [4, 5, max(6, longest)])."""
    c = cfg(cluster_mode="webshop_3", K=3)
    s = make_rule(c, [f"t{i}" for i in range(6)], [2, 4, 5, 6, 9, 5])
    assert [s.cluster[f"t{i}"] for i in range(6)] == [0, 0, 1, 2, 2, 1] and s.thresholds == [4.0, 5.0]


def test_clusters_quantile_balanced_random():
    L = [3, 4, 4, 5, 6, 7, 8, 9, 12, 15]
    rng = np.random.default_rng(0)
    k, thr = cluster_ids(L, 3, "quantile", rng)
    assert len(thr) == 2 and list(k) == sorted(k) and set(k) == {0, 1, 2}
    k, thr = cluster_ids(L, 5, "balanced", rng)
    assert list(k) == sorted(k) and max(np.bincount(k)) <= 3
    k, thr = cluster_ids(L, 3, "random", rng)
    assert sorted(np.bincount(k)) == [3, 3, 4] and thr == []
    k, _ = cluster_ids(L, 1, "quantile", rng)
    assert set(k) == {0}


def test_balanced_clusters_released_rule():
    # lengths 1 | 2 2 2 | 3 | 4 | 5 5 5 | 6: counts 1, 3, 1, 1, 3, 1 over unique [1..6]; N = 10, K = 3, N/K = 3.33.
    # Cuts (a, b) between unique lengths (a new cluster starts at unique index a, then b) -> sizes, spread:
    # (1,2) 1,3,6 5 | (1,3) 1,4,5 4 | (1,4) 1,5,4 4 | (1,5) 1,8,1 7 | (2,3) 4,1,5 4 | (2,4) 4,2,4 2 |
    # (2,5) 4,5,1 4 | (3,4) 5,1,4 4 | (3,5) 5,4,1 4 | (4,5) 6,3,1 5  -> only (2,4) has spread 2:
    # clusters {1,2,2,2} {3,4} {5,5,5,6}, thresholds = largest lengths 2 and 4 (the greedy quantile cut gave [2, 5])
    L = [1, 2, 2, 2, 3, 4, 5, 5, 5, 6]
    assert balanced_thresholds(L, 3) == [2.0, 4.0]
    k, thr = cluster_ids(L, 3, "balanced", np.random.default_rng(0))
    assert thr == [2.0, 4.0] and list(k) == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2]


def test_balanced_clusters_tie_goes_to_first_cut():
    # counts 1:1, 2:2, 3:1, 4:3, 5:1, 6:1 (N = 9, N/K = 3), K = 3; prefix counts 1, 3, 4, 7, 8, 9.
    # (1,2) 1,2,6 5 | (1,3) 1,3,5 4 | (1,4) 1,6,2 5 | (1,5) 1,7,1 6 | (2,3) 3,1,5 4 | (2,4) 3,4,2 2 |
    # (2,5) 3,5,1 4 | (3,4) 4,3,2 2 | (3,5) 4,4,1 3 | (4,5) 7,1,1 6
    # (2,4) and (3,4) tie on spread 2 and on imbalance |3-3| + |4-3| + |2-3| = 2 = |4-3| + |3-3| + |2-3|; the first
    # in combinations order, (2,4), wins -> thresholds 2 and 4 (the other would be 3 and 4)
    L = [1, 2, 2, 3, 4, 4, 4, 5, 6]
    assert balanced_thresholds(L, 3) == [2.0, 4.0]
    assert list(cluster_ids(L, 3, "balanced", None)[0]) == [0, 0, 0, 1, 1, 1, 1, 2, 2]


def test_balanced_clusters_fallback_and_k5_speed():
    import time
    # 3 unique lengths < K = 5: quantiles 0.25, 0.5, 0.75, 1 of [2, 2, 2, 3, 3, 9] (linear, position q * 5):
    # 1.25 -> 2, 2.5 -> 2.5 -> int 2, 3.75 -> 3, 5 -> 9; strictly increasing: 2, 3, 9; padded to 5: 2, 3, 9, 9, 9;
    # the last (the maximum) is implied -> [2, 3, 9, 9]; clusters 3 and 4 stay empty
    L = [2, 2, 2, 3, 3, 9]
    assert balanced_thresholds(L, 5) == [2.0, 3.0, 9.0, 9.0]
    assert list(cluster_ids(L, 5, "balanced", None)[0]) == [0, 0, 0, 1, 1, 2]
    assert balanced_thresholds([4, 4, 4], 2) == [4.0]  # one unique length: quantile 1 -> 4, padded to [4, 4]
    assert balanced_thresholds([4, 7], 1) == []  # K = 1: one cluster, no cut
    # 30 unique lengths once each, K = 5: only sizes 6 x 5 have spread 0 -> cuts after lengths 6, 12, 18, 24
    # (C(29, 4) = 23751 cut choices tried)
    t0 = time.time()
    assert balanced_thresholds(list(range(1, 31)), 5) == [6.0, 12.0, 18.0, 24.0]
    assert time.time() - t0 < 5


def test_online_recluster_by_success():
    s = make(lengths=(5, 5, 5, 5), K=2, cluster_mode="online", recluster_every=2)
    s.update(["t0", "t1", "t2", "t3"], [1.0, 1.0, 0.0, 0.0])
    s.depths(tasks_of([5, 5, 5, 5]), 2)
    assert s.cluster["t0"] == s.cluster["t1"] != s.cluster["t2"] == s.cluster["t3"]


def test_bad_input_raises():
    with pytest.raises(ValueError, match="unknown scheduler"):
        make(scheduler="oracle")
    with pytest.raises(ValueError, match="L must be >= 1"):
        make(lengths=(0, 3))
    s = make()
    with pytest.raises(ValueError, match="L must be >= 1"):
        s.depths([{"id": "t0", "L": 0}], 0)
    with pytest.raises(ValueError, match="step must be >= 0"):
        s.depths(tasks_of([3]), -1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        s.update(["t0"], [1.5])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        s.update(["t0"], [float("nan")])
    with pytest.raises(ValueError, match="needs each task's tok_cum"):  # no silent fall-back to action counts
        make(prefix_unit="token").depths(tasks_of([3]), 0)


@pytest.mark.parametrize("kw", [dict(), dict(cluster_mode="online", recluster_every=2), dict(scheduler="target_acc")])
def test_state_dict_round_trips_every_attribute(kw):
    """After some depths/updates, a fresh scheduler loaded from state_dict equals the old one in every attribute
    (all of __dict__, not a list of names), and both draw the same next depths."""
    L = (3, 5, 7, 9, 11, 13)
    a = make(L, seed=1, **kw)
    tasks = tasks_of(L)
    for step in range(5):
        a.depths(tasks, step)
        a.update([t["id"] for t in tasks], [0.25, 0.5, 1.0, 0.0, 0.75, 0.5],
                 [[0, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0]])
    b = make(L, seed=99, **kw)  # another seed: its RNG and (random-free) init must all be overwritten
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert set(vars(a)) == set(vars(b))
    for key, va in vars(a).items():
        vb = getattr(b, key)
        if key == "rng":
            assert va.bit_generator.state == vb.bit_generator.state
        elif isinstance(va, np.ndarray):  # an array comes back as an array of its dtype
            assert isinstance(vb, np.ndarray) and vb.dtype == va.dtype and va.tolist() == vb.tolist(), key
        elif key != "cfg":
            assert va == vb and type(va) is type(vb), key
    assert a.step == 4  # hand count: the last depths() step
    assert a.depths(tasks, 5) == b.depths(tasks, 5)


def test_state_dict_saves_a_new_attribute_without_a_line():
    s = make()
    s.my_new_counter = 7  # a variant's new state
    t = make()
    t.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert t.my_new_counter == 7


def test_registry_is_the_one_list_of_schedulers():
    import config
    from variants.rules import REGISTRY, is_g2
    assert config.rule_names() == list(REGISTRY)
    help_text = config.parser().format_help().replace("\n", " ")
    assert all(k in help_text for k in REGISTRY)
    assert {k for k in REGISTRY if REGISTRY[k].probes is True} == {"binary", "enum"}
    assert is_g2("g2") and is_g2("g2_ucb") and not is_g2("linear") and not is_g2("bogus")


def test_hybrid_probe_follows_the_family_not_the_name():
    """g2_ucb is Agent-G²-family: with --hybrid_probe a task whose last group was all-0 is probed first."""
    s = make(lengths=(10, 10, 10), scheduler="g2_ucb", hybrid_probe=True, mu0=0.5, lam=0.0, sampling="none")
    s.update(["t0", "t1", "t2"], [0.0, 0.5, 1.0])
    asked = []
    s.depths(tasks_of((10, 10, 10)), 1, lambda pairs: asked.extend(pairs) or [4] * len(pairs))
    assert [i for i, _ in asked] == [0, 2]  # t0 (all-0) and t2 (all-1) probed, t1 not


def test_g2_ucb_centre_bonus_by_hand():
    """mu0 0.4, lam 0 (mu_k = mu_global = 0.4), sampling none, ucb_c 0.2, one cluster.
    step 0: log(1) = 0, no bonus: r = 0.4, n = ceil(0.4 * 10) = 4.
    step 3 before any update (n_k = 0): 0.4 + 0.2 sqrt(log 4 / 1) = 0.4 + 0.2 * 1.17741 = 0.63548 -> n = ceil(6.35) = 7.
    After one update of 3 groups at p = 0.5 (acc 0.5 = p_target: mu_global stays 0.4 under sign? sign(0) = 0),
    n_k = 3: 0.4 + 0.2 sqrt(log 4 / 4) = 0.4 + 0.2 * 0.58871 = 0.51774 -> n = ceil(5.18) = 6."""
    s = make(lengths=(10, 10, 10), scheduler="g2_ucb", mu0=0.4, lam=0.0, sampling="none", ucb_c=0.2, K=1,
             mu_update="sign", p_target=0.5)
    T = tasks_of((10, 10, 10))
    assert s.depths(T, 0)["n"] == [4, 4, 4]
    assert s.depths(T, 3)["n"] == [7, 7, 7]
    s.update(["t0", "t1", "t2"], [0.5, 0.5, 0.5])
    assert s.mu_global == pytest.approx(0.4) and s.N.tolist() == [3.0]
    assert s.depths(T, 3)["n"] == [6, 6, 6]


def test_toy_scheduler_through_the_registry_alone_runs_in_the_simulator():
    """A fork adds a rule with one decorator (here, in the test file) and simulates it beside Agent-G²."""
    from tools import bench
    from variants.rules import REGISTRY, Baseline

    class Toy(Baseline):
        name, help = "toy_half_then_none", "half the walkthrough for 20 steps, then no hint"

        def depth(self, task, step):
            return prefix_len(0.5, task["L"]) if step < 20 else 0

    REGISTRY[Toy.name] = Toy
    try:
        s = make(lengths=(4, 10), scheduler="toy_half_then_none")
        assert s.depths(tasks_of((4, 10)), 0)["n"] == [2, 5] and s.depths(tasks_of((4, 10)), 20)["n"] == [0, 0]
        r = bench.simulate(dict(scheduler="toy_half_then_none"), seed=0)
        assert 0 <= r["band50"] <= 1 and r["rollouts_per_task"] == 1.0  # no probe: exactly R rollouts per group
        assert r["under50"] + r["band50"] + r["over50"] == pytest.approx(1.0)
    finally:
        del REGISTRY["toy_half_then_none"]


def test_bench_sched_only_simulates_one_rule_beside_g2():
    import subprocess
    import sys
    root = __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-m", "tools.bench", "sched", "--only", "g2_ucb", "--ucb_c", "0.3", "--seeds", "1"],
                       cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [x.split("  ")[0] for x in p.stdout.splitlines()[2:] if x and not x.startswith("(")]
    assert rows == ["g2", "g2_ucb ucb_c=0.3"]
    bad = subprocess.run([sys.executable, "-m", "tools.bench", "sched", "--only", "nope"], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "no scheduler 'nope'" in bad.stderr


def test_a_rule_brings_its_own_flag():
    """g2_ucb's flag is a field of the one flat config, named in the rule's class (flags), so a warning can say
    whose it is; the config still pickles."""
    import pickle

    import config
    from variants.rules import G2UCB
    assert G2UCB.flags == ("ucb_c",) and config.Config().ucb_c == 0.1
    assert config.get_config(["--scheduler", "g2_ucb", "--ucb_c", "0.3"]).ucb_c == 0.3
    c = config.get_config(["--ucb_c", "0.25"])
    assert pickle.loads(pickle.dumps(c)) == c


def test_state_round_trips_a_lazily_added_array_and_an_int_keyed_dict():
    """State a fork adds later keeps its type through a checkpoint (JSON): a numpy array stays an array of its
    dtype, an int-keyed dict keeps int keys, nested lists stay lists; a type that cannot come back is refused."""
    s = make()
    s.visits = np.arange(6, dtype=np.int64).reshape(2, 3)  # added after __init__
    s.by_step = {3: [0.5, [1, 2]], 10: [0.25, []]}
    s.weights = np.array([0.5, 0.25])
    back = make()
    back.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert isinstance(back.visits, np.ndarray) and back.visits.dtype == np.int64 and back.visits.tolist() == \
        [[0, 1, 2], [3, 4, 5]]
    assert back.by_step == {3: [0.5, [1, 2]], 10: [0.25, []]} and list(back.by_step) == [3, 10]
    assert isinstance(back.weights, np.ndarray) and back.weights.tolist() == [0.5, 0.25]
    s.pairs = (1, 2)
    with pytest.raises(TypeError, match="g2.pairs: a tuple cannot be saved"):
        s.state_dict()
    del s.pairs
    s.mixed = {1: "a", "b": 2}
    with pytest.raises(TypeError, match="g2.mixed: dict keys must be all str or all int"):
        s.state_dict()


def test_g2_ucb_logs_the_centre_it_draws_from():
    """mu0 0.4, lam 0, ucb_c 0.2, one cluster, step 3, no update yet: the draw's centre is 0.4 + 0.2 sqrt(log 4) =
    0.63548, and that is the mu_k the log shows (not the shared 0.4)."""
    s = make(lengths=(10,), scheduler="g2_ucb", mu0=0.4, lam=0.0, sampling="none", ucb_c=0.2, K=1)
    s.depths(tasks_of((10,)), 3)
    assert s.stats()["mu_k"] == [pytest.approx(0.4 + 0.2 * math.sqrt(math.log(4)))]


def test_g2_mix_by_hand():
    """One cluster, lam 1, p_target 0.5, mu0 0.8, mix_gap 0.15, sigma_min 0.1, gamma 1, alpha 0.5 (by hand):
    - at the start A = V = 0 on both components: centres 0.8 + 0.5 -+ 0.15 -> 1.15, 1.45, clipped to 1, 1;
      weights (0 + 0.05) / 0.1 = 0.5 each; the log's mu_k = 1, sigma_k = sqrt(0.5 (0.01 + 1) * 2 - 1) = 0.1.
    - tasks a (drawn from component 0, p = 1.0) and b (component 1, p = 0.5) update: A = [0.5, 0.25], V = [0, 0]
      (one task each: no variance); mu_global: acc 0.75 > 0.5 -> 0.7. Centres 0.7 + (0.5 - 0.5) - 0.15 = 0.55 and
      0.7 + (0.5 - 0.25) + 0.15 = 1.1 -> 1.0; weights 0.5 / 0.5: mu_k = 0.775, sigma_k^2 = 0.5 (0.01 + 0.3025) +
      0.5 (0.01 + 1) - 0.775^2 = 0.66125 - 0.600625 = 0.060625."""
    s = make(lengths=(10, 10), scheduler="g2_mix", K=1, lam=1.0, p_target=0.5, mu0=0.8, mix_gap=0.15,
             sigma_min=0.1, gamma=1.0, alpha=0.5, sampling="none")
    assert s.stats()["mu_k"] == [pytest.approx(1.0)] and s.stats()["sigma_k"] == [pytest.approx(0.1)]
    s.drawn = {"t0": 0, "t1": 1}
    s.update(["t0", "t1"], [1.0, 0.5])
    assert s.A_mix.tolist() == [[0.5, 0.25]] and s.V_mix.tolist() == [[0.0, 0.0]]
    assert s.mu_global == pytest.approx(0.7)
    mus, sigmas, w = s.components(0)
    assert mus.tolist() == pytest.approx([0.55, 1.0]) and w.tolist() == pytest.approx([0.5, 0.5])
    assert s.stats()["mu_k"] == [pytest.approx(0.775)]
    assert s.stats()["sigma_k"] == [pytest.approx(math.sqrt(0.060625))]
    n = s.depths(tasks_of((10, 10)), 1)["n"]  # sampling none: a draw sits on its component's centre
    assert all(k in (6, 9) for k in n) and set(s.drawn.values()) <= {0, 1}  # ceil(5.5) = 6, min(ceil(10), 9)


def test_a_rules_flag_under_another_rule_is_a_warning(capsys):
    import config
    config.get_config(["--scheduler", "g2", "--ucb_c", "0.3"])
    assert "warning: --ucb_c belongs to --scheduler g2_ucb; under --scheduler g2 it does nothing" in \
        capsys.readouterr().err
    config.get_config(["--scheduler", "g2_ucb", "--ucb_c", "0.3"])
    assert "warning" not in capsys.readouterr().err


def test_a_task_without_a_hint_is_played_at_depth_0_and_joins_a_cluster_when_it_gets_one():
    """lengths (3, None, 9): quantile thresholds of the known lengths [3, 9] with K 2: 6.0; t1 waits at depth 0
    without a draw; set_length(t1, 8) puts it in cluster 1 (8 > 6)."""
    s = make(lengths=(3, None, 9), K=2, sampling="none", mu0=0.5, lam=0.0)
    assert s.thresholds == [6.0] and "t1" not in s.cluster
    plan = s.depths([{"id": "t0", "L": 3}, {"id": "t1", "L": None}, {"id": "t2", "L": 9}], 0)
    assert plan["n"] == [2, 0, 5] and plan["r"][1] == 0.0  # ceil(0.5 * 3) = 2, ceil(0.5 * 9) = 5
    s.set_length("t1", 8)
    assert s.cluster["t1"] == 1


def test_the_readmes_rule_block_runs_from_its_own_file(tmp_path, monkeypatch):
    """README "Hack it": the depth-rule block, written to a file and selected as --scheduler my_rule:G2UCB.
    mu0 0.4, lam 0, sampling none, K 1, L 10 (by hand): step 0: log 1 = 0, r = 0.4, n = 4; step 3, no update
    yet: 0.4 + 0.1 sqrt(log 4 / 1) = 0.51774 -> n = ceil(5.18) = 6; after one update of three groups at p 0.5
    (acc = p_target: mu_global stays): n_k = 3, 0.4 + 0.1 sqrt(log 4 / 4) = 0.45887 -> n = 5."""
    import os

    import config
    from tools import bench
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    block = readme.split("**A depth rule**")[1].split("```python\n")[1].split("```")[0]
    (tmp_path / "my_rule.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    c = config.get_config(["--scheduler", "my_rule:G2UCB", "--mu0", "0.4", "--lam", "0", "--sampling", "none",
                           "--K", "1"])
    s = make_rule(c, ["t0", "t1", "t2"], [10, 10, 10], 0)
    assert type(s).__name__ == "G2UCB"
    T = tasks_of((10, 10, 10))
    assert s.depths(T, 0)["n"] == [4, 4, 4] and s.depths(T, 3)["n"] == [6, 6, 6]
    s.update(["t0", "t1", "t2"], [0.5, 0.5, 0.5])
    assert s.n_k == [3] and s.depths(T, 3)["n"] == [5, 5, 5]
    back = make_rule(c, ["t0", "t1", "t2"], [10, 10, 10], 7)
    back.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert back.n_k == [3] and back.depths(T, 3) == s.depths(T, 3)
    r = bench.simulate(dict(scheduler="my_rule:G2UCB"), seed=0)
    assert 0 <= r["band50"] <= 1 and r["rollouts_per_task"] == 1.0


def test_hint_free_share_plays_a_seeded_share_from_the_start_and_leaves_the_rule_alone():
    """--scheduler g2_hint_free --hint_free_share 0.5 on 4 hinted tasks and one without a hint: 2 of the 4 hinted
    tasks get n = 0, the other two the depths plain Agent-G² draws from the same seed; the same pick for the same
    (seed, step). Its update ignores the hint-free tasks: with both hinted tasks at p = 1 and the hint-free ones
    at p = 0, acc_B = 1 > p_target, so mu_global falls by Delta (0.8 -> 0.7), and A_k moves by alpha * 1."""
    import dataclasses
    from config import Config
    from scheduler import G2
    from variants.rules import REGISTRY
    cfg = dataclasses.replace(Config(), scheduler="g2_hint_free", hint_free_share=0.5, K=1, mu0=0.8, Delta=0.1,
                              alpha=0.2, p_target=0.5)
    ids, lengths = ["a", "b", "c", "d", "e"], [10, 10, 10, 10, None]
    tasks = [{"id": t, "L": L, "actions": []} for t, L in zip(ids, lengths)]
    rule, plain = REGISTRY["g2_hint_free"](cfg, ids, lengths, 3), G2(cfg, ids, lengths, 3)
    plan, want = rule.depths(tasks, 7), plain.depths(tasks, 7)
    free = [i for i in range(4) if plan["n"][i] == 0 and want["n"][i] > 0]
    assert len(free) == 2 and plan["n"][4] == 0 and rule.free == {ids[i] for i in free}
    assert [plan["n"][i] for i in range(4) if i not in free] == [want["n"][i] for i in range(4) if i not in free]
    again = REGISTRY["g2_hint_free"](cfg, ids, lengths, 3)
    assert again.depths(tasks, 7)["n"] == plan["n"]
    hinted = [i for i in range(4) if i not in free]
    p = [1.0 if i in hinted else 0.0 for i in range(4)]
    rule.update(ids[:4], p, [[int(x)] * 2 for x in p])
    assert rule.mu_global == pytest.approx(0.7) and rule.A[0] == pytest.approx(0.2) and rule.V[0] == 0.0
    assert rule.update([ids[i] for i in free], [0.0, 0.0], [[0, 0], [0, 0]]) is None  # only hint-free: no move
    import json
    saved = json.loads(json.dumps(rule.state_dict()))  # what every step's rank check and checkpoint write
    again.load_state_dict(saved)
    assert again.mu_global == pytest.approx(0.7) and again.depths(tasks, 8)["n"] == rule.depths(tasks, 8)["n"]
