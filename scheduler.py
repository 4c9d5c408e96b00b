"""Agent-G²'s depth scheduler as the paper writes it (docs/method.md §2); pure: state in, depths out.
    sched = make_rule(cfg, task_ids, lengths, seed)  # lengths: expert length L per task (None: no hint yet)
    plan = sched.depths(tasks, step)        # tasks: [{"id", "L", "actions"}] -> plan["n"], plan["r"]
    sched.update(task_ids, p_hat, flags)    # the batch's hinted tasks, in batch order; their p_hat, 0/1 flags
Ablations are one-line branches (--sampling, --lam 0, --sigma_mode fixed, --K); other rules: variants/."""
import math

import numpy as np

from plumbing.state import attrs_state, load_attrs


def prefix_len(r, L):
    """Expert prefix length for ratio r: n = min(ceil(r L), L - 1) >= 0 (the policy keeps the last step)."""
    if L < 1 or not 0.0 <= r <= 1.0:
        raise ValueError(f"expert length L must be >= 1 (got {L}) and the ratio in [0, 1] (got {r})")
    return max(0, min(math.ceil(r * L - 1e-9), L - 1))  # guard: 0.3 * 10 = 3.0000000000000004


def make_clusters(values, K):
    """Cluster ids (0 = shortest), K - 1 length quantiles [ZJU-REAL/Agent-G2 gmsv/alfworld.py, groups]."""
    v = np.asarray(values, dtype=float)
    thr = np.quantile(v, [k / K for k in range(1, K)]) if K > 1 else np.zeros(0)
    return np.searchsorted(thr, v, side="left"), [float(t) for t in thr]  # first threshold >= L: its cluster


class G2:
    """Agent-G²: tasks clustered by expert length, per cluster k EMAs of success A_k and its variance V_k, a
    centre mu_global steered toward p_target. Each task draws its ratio r ~ N(mu_k, sigma_k^2)."""
    name, g2, FIXED = "g2", True, ("cfg", "K", "ids", "tok")  # FIXED: set by __init__, never saved

    def __init__(self, cfg, task_ids, lengths, seed=0, tok=None):  # tok: for the rules that count tokens
        if any(L is not None and L < 1 for L in lengths):
            raise ValueError("every expert length L must be >= 1")
        self.cfg, self.K, self.ids, self.tok = cfg, cfg.K, [*task_ids], tok
        self.rng = np.random.default_rng(seed)
        known = [(t, L) for t, L in zip(self.ids, lengths) if L is not None]  # a task without a hint waits
        cl, self.thresholds = self.clusters([L for _, L in known]) if known else ([], [])
        self.cluster = {t: int(k) for (t, _), k in zip(known, cl)}  # task id -> k(i)
        self.mu_global = cfg.mu0  # method §2 step 5: starts at 0.8
        self.A, self.V = np.zeros(self.K), np.zeros(self.K)  # per cluster: EMAs of success and its variance
        self.probe_rollouts = self.step = 0  # rollouts spent on probes (probe rules), the last step drawn

    def clusters(self, lengths):
        return make_clusters(lengths, self.K)  # -> (cluster ids, thresholds)

    def mu_sigma(self, k, step=0):
        """Step 2: mu_k = clip(mu_global + lam (p_target - A_k), 0, 1), sigma_k = max(gamma V_k, sigma_min)"""
        c = self.cfg
        mu = float(np.clip(self.mu_global + c.lam * (c.p_target - self.A[k]), 0.0, 1.0))
        sigma = max(c.gamma * self.V[k], c.sigma_min) if c.sigma_mode == "dynamic" else c.sigma_fixed
        return mu, float(sigma)

    def draw(self, mu, sigma):  # r = clip(z, 0, 1), z ~ N(mu, sigma^2); ablations: uniform (same variance)
        s = self.cfg.sampling
        z = (self.rng.normal(mu, sigma) if s == "gaussian" else mu if s == "none"
             else self.rng.uniform(mu - math.sqrt(3) * sigma, mu + math.sqrt(3) * sigma))
        return float(np.clip(z, 0.0, 1.0))

    def prefix(self, r, task):  # ratio -> expert steps replayed
        return prefix_len(r, task["L"])

    def depth(self, task, step):  # one draw per task, shared by its R rollouts
        return self.prefix(self.draw(*self.mu_sigma(self.cluster[task["id"]], step)), task)

    def depths(self, tasks, step, probe=None):
        """tasks: [{"id", "L" (None: no hint, depth 0), "actions"}] -> {"n", "r", "probe_rollouts"}."""
        if step < 0 or any(t["L"] is not None and t["L"] < 1 for t in tasks):
            raise ValueError(f"step must be >= 0 (got {step}) and every expert length L must be >= 1")
        self.step = step
        n = [self.depth(t, step) if t["L"] else 0 for t in tasks]
        return {"n": n, "r": [ni / t["L"] if t["L"] else 0.0 for ni, t in zip(n, tasks)], "probe_rollouts": 0}

    def update(self, task_ids, p_hat, flags=None):
        """Step 5: mu_global += sign(p_target - acc_B) Delta; A_k, V_k: EMAs of mean, var(p_i) by cluster.
        p_hat[i], flags[i] of the batch's hinted tasks: success rate, kept 0/1 outcomes (None, []: no move)
        [ZJU-REAL/Agent-G2 gmsv/alfworld.py _update_scoreboard, update_after_train_batch]"""
        if not (kept := kept_tasks(task_ids, p_hat, flags)):
            return None  # nothing kept: nothing moves
        c, ids, p = self.cfg, [task_ids[i] for i in kept], np.array([float(p_hat[i]) for i in kept])
        f = None if flags is None else [np.asarray(flags[i], dtype=float) for i in kept]
        acc = self.batch_acc(p, f)  # acc_B
        self.mu_global = float(np.clip(self.mu_global + c.Delta * float(np.sign(c.p_target - acc)), 0.0, 1.0))
        ks = np.array([self.cluster[t] for t in ids])
        for k in np.unique(ks):  # only the clusters with a kept episode in the batch move
            x = self.cluster_values(p, f, ks == k)
            self.A[k] = (1 - c.alpha) * self.A[k] + c.alpha * x.mean()
            self.V[k] = (1 - c.alpha) * self.V[k] + c.alpha * x.var()  # population variance, as np.var there
        return ids, p, f, acc

    def cluster_values(self, p, flags, members):  # what a cluster's A_k / V_k average: its tasks' means
        return p[members]

    def batch_acc(self, p, flags):  # acc_B = mean_i p_i over the kept tasks, as the paper (method §2 step 5)
        return float(p.mean())

    def set_length(self, task_id, L):  # its cluster follows its hint's length (a new or changed hint)
        self.cluster[task_id] = int(np.searchsorted(self.thresholds, float(L), side="left"))

    def stats(self):  # what the log shows
        mu_k, sigma_k = zip(*[self.mu_sigma(k, self.step) for k in range(self.K)])
        return {"mu_global": self.mu_global, "A": self.A.tolist(), "V": self.V.tolist(), "mu_k": list(mu_k),
                "sigma_k": list(sigma_k), "thresholds": list(self.thresholds),
                "probe_rollouts_total": self.probe_rollouts}

    def state_dict(self):  # every attribute but FIXED: a new one is saved without a line here
        return attrs_state(self, self.FIXED, self.name)
    load_state_dict = load_attrs


def kept_tasks(task_ids, p_hat, flags):  # -> the indices of the tasks with a kept episode
    f = flags if flags is not None else [[]] * len(p_hat)
    if len(p_hat) != len(task_ids) or len(f) != len(task_ids) or not task_ids:
        raise ValueError("update needs one success rate and one list of trajectory flags per task")
    out_of_range = [p for p in p_hat if p is not None and (math.isnan(p) or p < 0 or p > 1)]
    if out_of_range or any(p is None and len(fi) > 0 for p, fi in zip(p_hat, f)):
        raise ValueError(f"p_hat must lie in [0, 1]: {p_hat} (or p_hat is None but it has trajectory flags)")
    return [i for i, p in enumerate(p_hat) if p is not None and (flags is None or len(flags[i]) > 0)]


PAPER = {"scheduler": "g2", "cluster_mode": "quantile", "mu_update": "sign", "stats_level": "task",
         "prefix_unit": "action", "hybrid_probe": False, "cap": 1.0}  # a run with these needs no variant


def make_rule(cfg, task_ids, lengths, seed=0, tok=None):
    """The rule the config names: G2, or its class in variants/rules.py (looked up once: config.variant)."""
    if all(getattr(cfg, k) == v for k, v in PAPER.items()):
        return G2(cfg, task_ids, lengths, seed, tok)
    from config import variant
    return variant("rules", cfg.scheduler)(cfg, task_ids, lengths, seed, tok)
