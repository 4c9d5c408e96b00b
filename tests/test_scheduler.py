"""Unit tests for every scheduler formula (SPEC §2-§4). Pure numpy, runs in a second."""
import dataclasses
import json
import math

import numpy as np
import pytest

from config import Config
from scheduler import Scheduler, make_clusters, prefix_len


def cfg(**kw):
    return dataclasses.replace(Config(), **kw)


def tasks_of(lengths):
    return [{"id": f"t{i}", "L": L} for i, L in enumerate(lengths)]


def make(lengths=(3, 5, 7, 9, 11, 13), seed=0, **kw):
    c = cfg(**kw)
    return Scheduler(c, [f"t{i}" for i in range(len(lengths))], list(lengths), seed=seed)


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
    assert prefix_len(0.0, 4, tok_cum) == 0
    assert prefix_len(0.2, 4, tok_cum) == 1  # 9 tokens -> first step boundary reaching it is 10
    assert prefix_len(0.3, 4, tok_cum) == 3  # 13.5 tokens -> needs 3 steps (40); action mode would give 2
    assert prefix_len(0.3, 4) == 2
    assert prefix_len(1.0, 4, tok_cum) == 3


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
        x = np.array([s.sample_ratio(0) for _ in range(4000)])
        assert abs(x.mean() - 0.5) < 0.01 and check(x), mode


def test_sampled_ratio_clipped_to_cap():
    s = make(lengths=(10,), K=1, cap=0.8, mu0=0.8, sigma_mode="fixed", sigma_fixed=0.5)
    x = np.array([s.sample_ratio(0) for _ in range(2000)])
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


def test_clusters_quantile_balanced_random():
    L = [3, 4, 4, 5, 6, 7, 8, 9, 12, 15]
    rng = np.random.default_rng(0)
    k, thr = make_clusters(L, 3, "quantile", rng)
    assert len(thr) == 2 and list(k) == sorted(k) and set(k) == {0, 1, 2}
    k, thr = make_clusters(L, 5, "balanced", rng)
    assert list(k) == sorted(k) and max(np.bincount(k)) <= 3
    k, thr = make_clusters(L, 3, "random", rng)
    assert sorted(np.bincount(k)) == [3, 3, 4] and thr == []
    k, _ = make_clusters(L, 1, "quantile", rng)
    assert set(k) == {0}


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
