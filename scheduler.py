"""Guidance-depth schedulers: Agent-G² (docs/method.md §2, §2.1), every baseline (§3) and ablation (§4).

Pure: no model, no environment. State in, depths out; stats in, state updated.

    sched = Scheduler(cfg, task_ids, lengths, seed=0)
    plan = sched.depths(tasks, step, probe)   # tasks: [{"id", "L", "tok_cum"?}] -> plan["n"], plan["r"]
    ... run R rollouts per task from its n-step expert prefix ...
    sched.update(task_ids, p_hat, flags)      # p_hat[i]: mean success of task i's group (None: no kept episode)
    sched.state_dict() / sched.load_state_dict(sd)   # JSON-able, RNG stream included

Probe schedulers (binary, enum, hybrid) call `probe([(i, n), ...]) -> [successes]`, one group of R
rollouts per pair; the caller keeps those rollouts, so the chosen probe's group is the one trained on.
`plan["probe_rollouts"]` counts only the extra rollouts beyond the R per task that GRPO spends.

Every rule is one function in RULES (`register` below the Scheduler class): config.py's --scheduler choices and
help come from it, and its `g2` flag (Agent-G² family) gives the hybrid probe and eval.py's checkpoint-state replay.
state_dict() saves every attribute but the fixed ones, so new state survives resume without a line there.

Run `python bench.py sched` for a side-by-side simulation of all of them (`--only NAME`: one rule beside Agent-G²).
"""
import math
from itertools import combinations

import numpy as np

RULES = {}  # name -> {"fn", "probe", "g2", "help"}: the one list of schedulers (config.py's choices come from it)
KNOBS = {}  # flag name -> (default, help): the rules' own config fields (config.py adds them to Config)
KNOBS_TAKEN = [False]  # set once config.py has built Config from KNOBS


def register(name, help, probe=False, g2=False, knobs=None):
    """Add a depth rule. probe=False: fn(sched, task, step) -> prefix steps n for one task.
    probe=True: fn(sched, tasks, step, probe) -> (n list, extra probe rollouts). g2=True: an Agent-G²-family rule
    (hybrid probe, checkpoint-state replay in eval.py diagnose). knobs: {flag: (default, help)}, new config fields
    (flags, presets, config.json) that the rule reads as s.cfg.<flag>."""
    if knobs and KNOBS_TAKEN[0]:
        raise RuntimeError(f"register({name!r}, knobs=...): config.Config is already built; register rules with "
                           "their own flags in scheduler.py itself")

    def deco(fn):
        RULES[name] = {"fn": fn, "probe": probe, "g2": g2, "help": help}
        KNOBS.update(knobs or {})
        return fn
    return deco


def is_g2(name):
    return RULES.get(name, {}).get("g2", False)


def render_prefix(actions):
    """The expert prefix as the released code renders it to measure tokens: "Step i: action" lines numbered from 1,
    joined by "\n" (no trailing newline). [ZJU-REAL/Agent-G2 gmsv/alfworld.py, format_expert_prefix]"""
    return "\n".join(f"Step {i}: {a}" for i, a in enumerate(actions, start=1))


def token_offsets(tok, walkthrough):
    """Token units (released code): offsets[j - 1] = token length of the rendered j-step prefix, i.e. the end offset
    of step j's line in the joined text; offsets[-1] is the whole prefix's length. Each prefix is encoded as one
    text, not line by line: BPE merges across the "\n" and the joined text has no final newline, so summed
    per-line counts drift. Actions are stripped as the authors strip them (they also drop empty actions, which
    would change L; our walkthroughs have none). [ZJU-REAL/Agent-G2 gmsv/alfworld.py, build_step_end_offsets]"""
    acts = [str(a).strip() for a in walkthrough]
    return [len(tok.encode(render_prefix(acts[:j]), add_special_tokens=False)) for j in range(1, len(acts) + 1)]


def prefix_len(r, L, tok_cum=None, max_steps=None):
    """Expert prefix length for ratio r.
    Action units (paper): n = min(ceil(r*L), L-1), never below 0; max_steps is not used.
    Token units (released code), tok_cum = token_offsets(...) of the task's L steps: the target is
    floor(r * total tokens); 0 tokens -> no prefix, the whole prefix -> L steps, else the first step whose line ends
    at or past the target; then capped at min(L-1, max_steps-1), so the policy keeps at least one step of the
    episode. [ZJU-REAL/Agent-G2 gmsv/alfworld.py, GMSVAlfworldPrefixRuntime._sample_plan, allow_full_prefix off]"""
    if L < 1:
        raise ValueError(f"expert length L must be >= 1, got {L}")
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"ratio must lie in [0, 1], got {r}")
    if tok_cum is None:
        n = math.ceil(r * L - 1e-9)  # guard: 0.3 * 10 = 3.0000000000000004
        return max(0, min(n, L - 1))
    if len(tok_cum) != L:
        raise ValueError(f"tok_cum has {len(tok_cum)} entries for L = {L}")
    total = int(tok_cum[-1])
    target = math.floor(total * r)  # their float arithmetic, no guard: floor(0.29 * 100) = 28 there too
    if target <= 0:
        n = 0
    elif target >= total:
        n = L
    else:
        n = next((j for j, end in enumerate(tok_cum, start=1) if end >= target), L)
    top = L - 1 if max_steps is None else min(L - 1, max_steps - 1)
    return max(0, min(n, top))


def balanced_thresholds(lengths, K):
    """Released code's "auto" difficulty groups: K-1 cluster thresholds from expert lengths.
    Over the sorted unique lengths, every choice of K-1 cut points between them is tried; the kept one minimises
    (largest cluster - smallest cluster, then sum |size - N/K|), ties going to the first choice in
    itertools.combinations order (they keep a strictly smaller score only). Threshold k = the largest length of
    cluster k; the last cluster's (the overall maximum) is implied, so K-1 are returned. With fewer unique lengths
    than K: int() of the quantiles 1/(K-1), 2/(K-1), ..., 1 (numpy's linear interpolation), keeping only strictly
    increasing values, padded with the last one to K thresholds (later clusters then stay empty).
    [ZJU-REAL/Agent-G2 gmsv/alfworld.py, _compute_group_thresholds; K = gmsv.num_difficulty_groups, 5 in
    verl/trainer/config/ppo_trainer.yaml]"""
    v = np.asarray(lengths, dtype=float)
    u, counts = np.unique(v, return_counts=True)
    if len(u) < K:
        thr = []
        for q in np.linspace(0.0, 1.0, K)[1:]:
            t = int(np.quantile(v, q))  # lengths >= 1, so their max(1, .) guard never fires
            if not thr or t > thr[-1]:
                thr.append(t)
        thr += [thr[-1]] * (K - len(thr))
        return [float(t) for t in thr[:K - 1]]
    N, cum = len(v), np.concatenate([[0], np.cumsum(counts)])  # cum[b]: tasks with one of the b shortest lengths
    best, best_score = (), None
    for cuts in combinations(range(1, len(u)), K - 1):  # a cut b: a new cluster starts at the b-th unique length
        edges = (0, *cuts, len(u))
        sizes = [int(cum[b] - cum[a]) for a, b in zip(edges, edges[1:])]
        score = (max(sizes) - min(sizes), sum(abs(s - N / K) for s in sizes))  # same float sum as theirs: same ties
        if best_score is None or score < best_score:
            best, best_score = cuts, score
    return [float(u[b - 1]) for b in best]


def make_clusters(values, K, mode, rng):
    """Cluster ids (0 = shortest / easiest) and the thresholds chosen, from per-task values
    (expert lengths; for 'online', 1 - rolling success). A task joins the first cluster whose threshold is >= its
    value (the last cluster: everything longer) [ZJU-REAL/Agent-G2 gmsv/alfworld.py, difficulty_group_for_length]."""
    v = np.asarray(values, dtype=float)
    if mode in ("quantile", "online"):  # paper: quantiles of expert length
        thr = np.quantile(v, [k / K for k in range(1, K)]) if K > 1 else np.zeros(0)
    elif mode == "balanced":  # released code
        thr = np.asarray(balanced_thresholds(v, K))
    elif mode == "webshop_3":  # the authors' WebShop launcher (difficulty_group_mode=webshop_3): L <= 4 | 5 | >= 6
        thr = np.asarray([4.0, 5.0])  # [ZJU-REAL/Agent-G2 gmsv/webshop.py, _compute_webshop_three_group_thresholds]
    elif mode == "random":
        return rng.permutation(len(v)) % K, []
    else:
        raise ValueError(f"unknown cluster mode {mode!r}")
    return np.searchsorted(thr, v, side="left"), [float(t) for t in thr]


class Scheduler:
    def __init__(self, cfg, task_ids, lengths, seed=0):
        if cfg.scheduler not in RULES:
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
        self.N = np.zeros(self.K)  # groups with a kept episode seen per cluster
        self.d = 0  # target-acc counter
        self.succ = {}  # task id -> EMA of its success (online clusters) ; last_p: its last group mean
        self.last_p = {}
        self.probe_rollouts = 0  # total extra rollouts spent on probes
        self.step = 0  # the last step depths() was asked for
        self.n_updates = 0  # update() calls with a kept episode

    # ---- Agent-G² per-task distribution (docs/method.md §2 step 2) ----
    def mu_sigma(self, k, step=0):
        c = self.cfg
        mu_k = float(np.clip(self.mu_global + c.lam * (c.p_target - self.A[k]), 0.0, c.cap))
        sigma_k = max(c.gamma * self.V[k], c.sigma_min) if c.sigma_mode == "dynamic" else c.sigma_fixed
        return mu_k, float(sigma_k)

    def sample_ratio(self, k, step=0):
        return self.draw(*self.mu_sigma(k, step))

    def draw(self, mu, sigma):  # one ratio around mu in the configured sampling mode, clipped to [0, cap]
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
        c = self.cfg
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        for t in tasks:
            if t["L"] < 1:
                raise ValueError(f"task {t['id']}: expert length L must be >= 1, got {t['L']}")
        if c.cluster_mode == "online" and step > 0 and step % c.recluster_every == 0:
            self.recluster()
        if c.prefix_unit == "token" and any("tok_cum" not in t for t in tasks):
            raise ValueError("prefix_unit 'token' needs each task's tok_cum (token_offsets of its walkthrough)")
        rule = RULES[self.name]
        if rule["probe"]:
            n, spent = rule["fn"](self, tasks, step, probe)
        else:
            n, spent = [rule["fn"](self, t, step) for t in tasks], 0
        if rule["g2"] and c.hybrid_probe:
            n, spent = self._hybrid(tasks, n, probe, step)
        self.probe_rollouts += spent
        self.step = step
        return {"n": n, "r": [ni / t["L"] for ni, t in zip(n, tasks)], "probe_rollouts": spent}

    def _prefix(self, r, t):  # ratio -> prefix steps in the configured unit (token units: released code's cap too)
        if self.cfg.prefix_unit == "token":
            return prefix_len(r, t["L"], t["tok_cum"], self.cfg.max_steps)
        return prefix_len(r, t["L"])

    def _closest(self, tried):  # probed depth with successes closest to R/2 (ties: the shallower)
        return min(tried, key=lambda n: (abs(tried[n] - self.cfg.group_size / 2), n))

    def _binary(self, tasks, step, probe):
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

    def _enum(self, tasks, step, probe):
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

    def _hybrid(self, tasks, n, probe, step=0):
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
            shift = self.mu_sigma(k, step)[1] * (1 if s == 0 else -1)
            n[i] = self._prefix(float(np.clip(ni / L + shift, 0, c.cap)), tasks[i])
            spent += c.group_size
        return n, spent

    # ---- feedback from the same batch (docs/method.md §2 step 5) ----
    def update(self, task_ids, p_hat, flags=None):
        """p_hat[i]: mean success of task i's kept episodes, or None when it has none (every episode hit an
        environment error); flags[i] (optional): those episodes' 0/1 outcomes, [] when none. A task without a kept
        episode says nothing about difficulty: it leaves mu_global's batch accuracy, A_k, V_k, last_p and succ
        alone, and a batch with no kept episode at all changes nothing. [ZJU-REAL/Agent-G2 gmsv/alfworld.py,
        _update_scoreboard skips a group with no outcome]"""
        c = self.cfg
        if len(p_hat) != len(task_ids) or len(task_ids) == 0:
            raise ValueError("update needs one success rate per task of the batch")
        if flags is not None and len(flags) != len(task_ids):
            raise ValueError("update needs one list of trajectory flags per task of the batch")
        kept = []  # indices of tasks with at least one kept episode
        for i, pi in enumerate(p_hat):
            if flags is not None and len(flags[i]) == 0:
                continue  # no kept episode, whatever p_hat says (a stand-in 0.0 must not count as a failure)
            if pi is None:
                if flags is not None:
                    raise ValueError(f"task {task_ids[i]}: p_hat is None but it has trajectory flags {flags[i]}")
                continue
            kept.append(i)
        p = np.array([float(p_hat[i]) for i in kept])
        if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
            raise ValueError(f"success rates must lie in [0, 1], got {p.tolist()}")
        if not kept:
            return
        ids = [task_ids[i] for i in kept]
        f = None if flags is None else [np.asarray(flags[i], dtype=float) for i in kept]
        # acc_B: the share of successful trajectories of the batch, so a task with more kept episodes weighs more;
        # without flags, the mean of the task means. [ZJU-REAL/Agent-G2 gmsv/alfworld.py, update_after_train_batch:
        # batch accuracy = mean over rollouts]
        acc = float(np.concatenate(f).mean()) if f is not None else float(p.mean())
        self.n_updates += 1
        if self.name == "target_acc" and acc >= 0.5:
            self.d += 1
        if c.mu_update == "sign":
            self.mu_global += float(np.sign(c.p_target - acc)) * c.Delta
        elif c.mu_update == "deadband":
            self.mu_global += c.Delta if acc < c.acc_low else -c.Delta if acc > c.acc_high else 0.0
        else:  # proportional
            self.mu_global += c.kp * (c.p_target - acc)
        self.mu_global = float(np.clip(self.mu_global, 0.0, c.cap))
        ks = np.array([self.cluster[t] for t in ids])
        for k in np.unique(ks):  # only clusters with a kept episode in the batch move
            if c.stats_level == "traj" and f is not None:
                x = np.concatenate([f[j] for j in np.flatnonzero(ks == k)])
            else:
                x = p[ks == k]
            self.A[k] = (1 - c.alpha) * self.A[k] + c.alpha * x.mean()
            self.V[k] = (1 - c.alpha) * self.V[k] + c.alpha * x.var()  # population variance, as np.var there
            self.N[k] += int(np.sum(ks == k))
        for t, pi in zip(ids, p):
            self.last_p[t] = float(pi)
            self.succ[t] = float(pi) if t not in self.succ else 0.5 * self.succ[t] + 0.5 * float(pi)

    def recluster(self):
        """Online clusters: quantiles of 1 - rolling success; unseen tasks get their cluster's A_k."""
        score = [1.0 - self.succ.get(t, self.A[self.cluster[t]]) for t in self.ids]
        cl, self.thresholds = make_clusters(score, self.K, "online", self.rng)
        self.cluster = {t: int(k) for t, k in zip(self.ids, cl)}

    # ---- logging / checkpoints ----
    def stats(self):
        ms = [self.mu_sigma(k, self.step) for k in range(self.K)]
        return {"mu_global": self.mu_global, "A": self.A.tolist(), "V": self.V.tolist(),
                "mu_k": [m for m, _ in ms], "sigma_k": [s for _, s in ms], "d": self.d,
                "thresholds": list(self.thresholds), "probe_rollouts_total": self.probe_rollouts}

    FIXED = ("cfg", "name", "K", "ids", "lengths")  # set by __init__ from its arguments, never changed

    def state_dict(self):
        """Every attribute but FIXED (a new one is saved without a line here), JSON-able; the RNG as its state."""
        sd = {}
        for key, v in self.__dict__.items():
            if key in self.FIXED:
                continue
            if key == "rng":
                v = v.bit_generator.state
            elif isinstance(v, np.ndarray):
                v = v.tolist()
            elif isinstance(v, dict):
                v = dict(v)
            elif isinstance(v, list):
                v = list(v)
            sd[key] = v
        return sd

    def load_state_dict(self, sd):
        for key, v in sd.items():
            if key == "rng":
                self.rng.bit_generator.state = v
            elif isinstance(getattr(self, key, None), np.ndarray):
                setattr(self, key, np.array(v, dtype=float))
            elif key == "cluster":
                self.cluster = {t: int(k) for t, k in v.items()}
            elif isinstance(v, dict):
                setattr(self, key, dict(v))
            elif isinstance(v, list):
                setattr(self, key, list(v))
            else:
                setattr(self, key, v)


# ---- the rules (docs/method.md §2, §3): one registered function each ----
@register("g2", "Agent-G²: per-cluster Gaussian ratio around mu_global + lam (p_target - A_k)", g2=True)
def _g2(s, t, step):
    return s._prefix(s.sample_ratio(s.cluster[t["id"]], step), t)


@register("g2_ucb", "Agent-G² with an exploration bonus on the centre: mu_k + ucb_c sqrt(log(t+1) / (n_k+1))",
          g2=True, knobs={"ucb_c": (0.1, "--scheduler g2_ucb: exploration bonus weight on the cluster centre")})
def _g2_ucb(s, t, step):
    k = s.cluster[t["id"]]
    mu, sigma = s.mu_sigma(k, step)
    mu = min(mu + s.cfg.ucb_c * math.sqrt(math.log(step + 1) / (s.N[k] + 1)), s.cfg.cap)
    return s._prefix(s.draw(mu, sigma), t)


def _frac(s, step):
    return min(step, s.cfg.steps - 1) / max(s.cfg.steps - 1, 1)


register("none", "plain GRPO: no hint")(lambda s, t, step: 0)
register("fixed", "ratio --fixed_ratio throughout")(lambda s, t, step: s._prefix(s.cfg.fixed_ratio, t))
register("linear", "ratio 1 -> 0 linearly over --steps")(lambda s, t, step: s._prefix(1.0 - _frac(s, step), t))
register("cosine", "ratio cos(pi/2 * progress)")(
    lambda s, t, step: s._prefix(max(0.0, math.cos(math.pi / 2 * _frac(s, step))), t))
register("step", "L-1 steps, one fewer every --step_every")(
    lambda s, t, step: max(t["L"] - 1 - step // s.cfg.step_every, 0))
register("target_acc", "L-1 steps, one fewer after each batch with accuracy >= 0.5")(
    lambda s, t, step: max(t["L"] - 1 - s.d, 0))
register("binary", "binary search of the depth by probe groups", probe=True)(Scheduler._binary)
register("enum", "every depth of a grid probed, the closest to R/2 kept", probe=True)(Scheduler._enum)
