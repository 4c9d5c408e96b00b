"""Guidance-depth schedulers: Agent-G² (SPEC §2, §2.1), every baseline (§3) and ablation (§4).

Pure: no model, no environment. State in, depths out; stats in, state updated.

    sched = Scheduler(cfg, task_ids, lengths, seed=0)
    plan = sched.depths(tasks, step, probe)   # tasks: [{"id", "L", "tok_cum"?}] -> plan["n"], plan["r"]
    ... run R rollouts per task from its n-step expert prefix ...
    sched.update(task_ids, p_hat, flags)      # p_hat[i] = mean success of task i's group
    sched.state_dict() / sched.load_state_dict(sd)   # JSON-able, RNG stream included

Probe schedulers (binary, enum, hybrid) call `probe([(i, n), ...]) -> [successes]`, one group of R
rollouts per pair; the caller keeps those rollouts, so the chosen probe's group is the one trained on.
`plan["probe_rollouts"]` counts only the extra rollouts beyond the R per task that GRPO spends.

Run `python bench.py sched` for a side-by-side simulation of all of them.
"""
import math

import numpy as np

PROBE = {"binary", "enum"}


def prefix_len(r, L, tok_cum=None):
    """Expert prefix length for ratio r: n = min(ceil(r*L), L-1), never below 0.
    tok_cum (released code): cumulative token length of the rendered prefix lines, tok_cum[j-1] for j steps;
    the ratio applies to the total and is rounded up to a step boundary."""
    if L < 1:
        raise ValueError(f"expert length L must be >= 1, got {L}")
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"ratio must lie in [0, 1], got {r}")
    if tok_cum is None:
        n = math.ceil(r * L - 1e-9)  # guard: 0.3 * 10 = 3.0000000000000004
    else:
        if len(tok_cum) != L:
            raise ValueError(f"tok_cum has {len(tok_cum)} entries for L = {L}")
        n = 0 if r <= 0 else int(np.searchsorted(np.asarray(tok_cum), r * tok_cum[-1] - 1e-9)) + 1
    return max(0, min(n, L - 1))


def make_clusters(values, K, mode, rng):
    """Cluster ids (0 = shortest / easiest) and the thresholds chosen, from per-task values
    (expert lengths; for 'online', 1 - rolling success)."""
    v = np.asarray(values, dtype=float)
    if mode in ("quantile", "online"):  # paper: quantiles of expert length
        thr = np.quantile(v, [k / K for k in range(1, K)]) if K > 1 else np.zeros(0)
    elif mode == "balanced":  # released: balanced sizes over the sorted unique lengths
        u, c = np.unique(v, return_counts=True)
        cum, thr = np.cumsum(c), []
        for k in range(1, K):
            j = int(np.searchsorted(cum, k * len(v) / K))  # first unique length reaching k/K of the tasks
            if j < len(u) - 1 and (not thr or u[j] > thr[-1]):
                thr.append(u[j])
        thr = np.asarray(thr)
    elif mode == "random":
        return rng.permutation(len(v)) % K, []
    else:
        raise ValueError(f"unknown cluster mode {mode!r}")
    return np.searchsorted(thr, v, side="left"), [float(t) for t in thr]


class Scheduler:
    def __init__(self, cfg, task_ids, lengths, seed=0):
        if cfg.scheduler not in {"g2", "none", "fixed", "linear", "cosine", "step", "target_acc", "binary", "enum"}:
            raise ValueError(f"unknown scheduler {cfg.scheduler!r}")
        if min(lengths) < 1:
            raise ValueError("every expert length L must be >= 1")
        self.cfg, self.name, self.K = cfg, cfg.scheduler, cfg.K
        self.rng = np.random.default_rng(seed)
        self.ids, self.lengths = list(task_ids), list(lengths)
        mode = "quantile" if cfg.cluster_mode == "online" else cfg.cluster_mode
        cl, self.thresholds = make_clusters(self.lengths, self.K, mode, self.rng)
        self.cluster = {t: int(k) for t, k in zip(self.ids, cl)}
        self.mu_global = cfg.mu0
        self.A, self.V = np.zeros(self.K), np.zeros(self.K)
        self.d = 0  # target-acc counter
        self.succ = {}  # task id -> EMA of its success (online clusters) ; last_p: its last group mean
        self.last_p = {}
        self.probe_rollouts = 0  # total extra rollouts spent on probes

    # ---- Agent-G² per-task distribution (SPEC §2 step 2) ----
    def mu_sigma(self, k):
        c = self.cfg
        mu_k = float(np.clip(self.mu_global + c.lam * (c.p_target - self.A[k]), 0.0, c.cap))
        sigma_k = max(c.gamma * self.V[k], c.sigma_min) if c.sigma_mode == "dynamic" else c.sigma_fixed
        return mu_k, float(sigma_k)

    def sample_ratio(self, k):
        mu, sigma = self.mu_sigma(k)
        if self.cfg.sampling == "gaussian":
            z = self.rng.normal(mu, sigma)
        elif self.cfg.sampling == "uniform":  # same variance: U(mu - sqrt(3) sigma, mu + sqrt(3) sigma)
            z = self.rng.uniform(mu - math.sqrt(3) * sigma, mu + math.sqrt(3) * sigma)
        else:  # "none": sigma_i = 0
            z = mu
        return float(np.clip(z, 0.0, self.cfg.cap))

    # ---- depths for one batch ----
    def depths(self, tasks, step, probe=None):
        """tasks: [{"id", "L", "tok_cum" (token prefixes only)}] -> {"n": [...], "r": [...], "probe_rollouts": int}"""
        c, T, R = self.cfg, self.cfg.steps, self.cfg.group_size
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        for t in tasks:
            if t["L"] < 1:
                raise ValueError(f"task {t['id']}: expert length L must be >= 1, got {t['L']}")
        if c.cluster_mode == "online" and step > 0 and step % c.recluster_every == 0:
            self.recluster()
        if c.prefix_unit == "token" and any("tok_cum" not in t for t in tasks):
            raise ValueError("prefix_unit 'token' needs each task's tok_cum (rendered prefix token lengths)")
        tok = [t.get("tok_cum") if c.prefix_unit == "token" else None for t in tasks]
        frac = min(step, T - 1) / max(T - 1, 1)
        n, spent = [], 0
        for t, tc in zip(tasks, tok):
            L = t["L"]
            if self.name == "g2":
                n.append(prefix_len(self.sample_ratio(self.cluster[t["id"]]), L, tc))
            elif self.name == "none":
                n.append(0)
            elif self.name == "fixed":
                n.append(prefix_len(c.fixed_ratio, L, tc))
            elif self.name == "linear":
                n.append(prefix_len(1.0 - frac, L, tc))
            elif self.name == "cosine":
                n.append(prefix_len(max(0.0, math.cos(math.pi / 2 * frac)), L, tc))
            elif self.name == "step":
                n.append(max(L - 1 - step // c.step_every, 0))
            elif self.name == "target_acc":
                n.append(max(L - 1 - self.d, 0))
            else:
                n.append(None)  # probe methods fill these in below
        if self.name == "binary":
            n, spent = self._binary(tasks, probe)
        elif self.name == "enum":
            n, spent = self._enum(tasks, probe)
        elif self.name == "g2" and c.hybrid_probe:
            n, spent = self._hybrid(tasks, n, probe)
        self.probe_rollouts += spent
        return {"n": n, "r": [ni / t["L"] for ni, t in zip(n, tasks)], "probe_rollouts": spent}

    def _closest(self, tried):  # probed depth with successes closest to R/2 (ties: the shallower)
        return min(tried, key=lambda n: (abs(tried[n] - self.cfg.group_size / 2), n))

    def _binary(self, tasks, probe):
        c, target = self.cfg, self.cfg.group_size / 2
        lo = [0] * len(tasks)
        hi = [min(t["L"] - 1, c.max_steps - 1) for t in tasks]
        tried = [dict() for _ in tasks]
        active = list(range(len(tasks)))
        while active:
            pairs = [(i, (lo[i] + hi[i]) // 2) for i in active]
            for (i, mid), s in zip(pairs, probe(pairs)):
                tried[i][mid] = s
                if s < target:
                    lo[i] = mid + 1  # too hard: more expert steps
                elif s > target:
                    hi[i] = mid - 1
                else:
                    hi[i] = lo[i] - 1  # exactly on target: stop
            active = [i for i in active if lo[i] <= hi[i] and len(tried[i]) < c.max_probes
                      and (lo[i] + hi[i]) // 2 not in tried[i]]
        spent = sum(len(t) - 1 for t in tried) * c.group_size
        return [self._closest(t) for t in tried], spent

    def _enum(self, tasks, probe):
        c = self.cfg
        grids = []
        for t in tasks:
            top = min(t["L"] - 1, c.max_steps - 1)
            if c.enum_grid > 0:
                g = {min(prefix_len(r, t["L"]), top) for r in np.arange(0, 1 + 1e-9, c.enum_grid)}
            else:
                g = set(range(top + 1))
            grids.append(sorted(g))
        pairs = [(i, n) for i, g in enumerate(grids) for n in g]
        res = probe(pairs)
        tried = [dict() for _ in tasks]
        for (i, n), s in zip(pairs, res):
            tried[i][n] = s
        return [self._closest(t) for t in tried], (len(pairs) - len(tasks)) * c.group_size

    def _hybrid(self, tasks, n, probe):
        """Beyond the paper: a task whose last group was all-0 / all-1 first probes its sampled depth;
        if that group is degenerate too, move one sigma deeper / shallower (one extra group at most)."""
        c, flagged = self.cfg, [i for i, t in enumerate(tasks) if self.last_p.get(t["id"]) in (0.0, 1.0)]
        if not flagged:
            return n, 0
        pairs = [(i, n[i]) for i in flagged]
        spent = 0
        for (i, ni), s in zip(pairs, probe(pairs)):
            if 0 < s < c.group_size:
                continue  # in band: the probe group is the policy group, no extra cost
            L, k = tasks[i]["L"], self.cluster[tasks[i]["id"]]
            shift = self.mu_sigma(k)[1] * (1 if s == 0 else -1)
            n[i] = prefix_len(float(np.clip(ni / L + shift, 0, c.cap)), L, tasks[i].get("tok_cum")
                              if c.prefix_unit == "token" else None)
            spent += c.group_size
        return n, spent

    # ---- feedback from the same batch (SPEC §2 step 5) ----
    def update(self, task_ids, p_hat, flags=None):
        c = self.cfg
        p = np.asarray(p_hat, dtype=float)
        if len(p) != len(task_ids) or len(p) == 0:
            raise ValueError("update needs one success rate per task of the batch")
        if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
            raise ValueError(f"success rates must lie in [0, 1], got {p.tolist()}")
        acc = float(p.mean())
        if self.name == "target_acc" and acc >= 0.5:
            self.d += 1
        if c.mu_update == "sign":
            self.mu_global += float(np.sign(c.p_target - acc)) * c.Delta
        elif c.mu_update == "deadband":
            self.mu_global += c.Delta if acc < c.acc_low else -c.Delta if acc > c.acc_high else 0.0
        else:  # proportional
            self.mu_global += c.kp * (c.p_target - acc)
        self.mu_global = float(np.clip(self.mu_global, 0.0, c.cap))
        ks = np.array([self.cluster[t] for t in task_ids])
        for k in np.unique(ks):  # only clusters present in the batch move
            if c.stats_level == "traj" and flags is not None:
                x = np.concatenate([np.asarray(flags[i], float) for i in np.flatnonzero(ks == k)])
            else:
                x = p[ks == k]
            self.A[k] = (1 - c.alpha) * self.A[k] + c.alpha * x.mean()
            self.V[k] = (1 - c.alpha) * self.V[k] + c.alpha * x.var()
        for t, pi in zip(task_ids, p):
            self.last_p[t] = float(pi)
            self.succ[t] = float(pi) if t not in self.succ else 0.5 * self.succ[t] + 0.5 * float(pi)

    def recluster(self):
        """Online clusters: quantiles of 1 - rolling success; unseen tasks get their cluster's A_k."""
        score = [1.0 - self.succ.get(t, self.A[self.cluster[t]]) for t in self.ids]
        cl, self.thresholds = make_clusters(score, self.K, "online", self.rng)
        self.cluster = {t: int(k) for t, k in zip(self.ids, cl)}

    # ---- logging / checkpoints ----
    def stats(self):
        ms = [self.mu_sigma(k) for k in range(self.K)]
        return {"mu_global": self.mu_global, "A": self.A.tolist(), "V": self.V.tolist(),
                "mu_k": [m for m, _ in ms], "sigma_k": [s for _, s in ms], "d": self.d,
                "thresholds": list(self.thresholds), "probe_rollouts_total": self.probe_rollouts}

    def state_dict(self):
        return {"mu_global": self.mu_global, "A": self.A.tolist(), "V": self.V.tolist(), "d": self.d,
                "succ": self.succ, "last_p": self.last_p, "cluster": self.cluster,
                "thresholds": list(self.thresholds), "probe_rollouts": self.probe_rollouts,
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, sd):
        self.mu_global, self.d, self.probe_rollouts = sd["mu_global"], sd["d"], sd["probe_rollouts"]
        self.A, self.V = np.array(sd["A"], dtype=float), np.array(sd["V"], dtype=float)
        self.succ, self.last_p = dict(sd["succ"]), dict(sd["last_p"])
        self.cluster, self.thresholds = {t: int(k) for t, k in sd["cluster"].items()}, list(sd["thresholds"])
        self.rng.bit_generator.state = sd["rng"]
