"""Guidance-depth schedulers: Agent-G² (method §2), the released code's variants (§2.1), every baseline
(§3) and the rules beyond the paper. Pure: no model, no environment. State in, depths out; statistics in,
state out.

    sched = Scheduler(cfg, task_ids, lengths, seed=0)  # lengths: expert length L per task (None: no hint yet)
    plan = sched.depths(tasks, step, probe)   # tasks: [{"id", "L", "tok_cum"?}] -> plan["n"], plan["r"]
    ... R rollouts per task from its n-step expert prefix ...
    sched.update(task_ids, p_hat, flags)      # p_hat[i]: task i's group's mean success (None: none kept)
    sched.state_dict() / sched.load_state_dict(sd)   # JSON-able; numpy arrays and int-keyed dicts round-trip

Reading order: the paper's Agent-G² first (the clusters, mu_global, the A_k / V_k EMAs, the per-task draw and
the prefix length), then the variants, each under one tag you can grep: [released] the authors' code,
[baseline] the schedules and probes the paper compares with, [beyond] rules beyond the paper. A depth rule is
one Rule subclass (its depth, its own update, state and stats, the mu/sigma the log shows), registered by
name: config.py's --scheduler choices and flags come from the registry. `python -m tools.bench sched`
simulates them side by side.
"""
import math
from itertools import combinations

import numpy as np

# name -> Rule subclass: the one list of depth rules (config.py's --scheduler choices come from it)
RULES = {}
KNOBS = {}  # flag -> (default, help): the rules' own config fields (config.py adds them to Config)
knobs_frozen = False  # True once config.py has built Config from KNOBS (freeze_knobs)


# ============================================================================================================
# Agent-G² as the paper writes it (method §2)
# ============================================================================================================
def prefix_len(r, L, tok_cum=None, max_steps=None):
    """Expert prefix length for ratio r: n = min(ceil(r L), L - 1), never below 0 (the policy keeps at least
    the last step). tok_cum, max_steps: [released] token units (token_prefix_len)."""
    if L < 1:
        raise ValueError(f"expert length L must be >= 1, got {L}")
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"ratio must lie in [0, 1], got {r}")
    if tok_cum is not None:
        return token_prefix_len(r, L, tok_cum, max_steps)
    return max(0, min(math.ceil(r * L - 1e-9), L - 1))  # guard: 0.3 * 10 = 3.0000000000000004


def make_clusters(values, K, mode, rng):
    """Cluster ids (0 = shortest) and the K - 1 thresholds, from per-task expert lengths: the paper's
    quantiles of length. A task joins the first cluster whose threshold is >= its value [ZJU-REAL/Agent-G2
    gmsv/alfworld.py, difficulty_group_for_length]. Other modes: CLUSTERINGS, below."""
    v = np.asarray(values, dtype=float)
    if mode in ("quantile", "online"):
        thr = np.quantile(v, [k / K for k in range(1, K)]) if K > 1 else np.zeros(0)
    elif mode in CLUSTERINGS:
        return CLUSTERINGS[mode](v, K, rng)
    else:
        raise ValueError(f"unknown cluster mode {mode!r}")
    return np.searchsorted(thr, v, side="left"), [float(t) for t in thr]


class Scheduler:
    """The shared statistics of Agent-G² (mu_global, A_k, V_k per cluster) and the configured depth rule."""

    def __init__(self, cfg, task_ids, lengths, seed=0):
        if cfg.scheduler not in RULES:
            raise ValueError(f"unknown scheduler {cfg.scheduler!r}")
        if any(L is not None and L < 1 for L in lengths):
            raise ValueError("every expert length L must be >= 1")
        self.cfg, self.name, self.K, self.ids = cfg, cfg.scheduler, cfg.K, list(task_ids)
        self.rng = np.random.default_rng(seed)
        known = [(t, L) for t, L in zip(self.ids, lengths) if L is not None]  # a task without a hint waits
        mode = "quantile" if cfg.cluster_mode == "online" else cfg.cluster_mode
        cl, self.thresholds = (make_clusters([L for _, L in known], self.K, mode, self.rng) if known
                               else ([], []))
        self.cluster = {t: int(k) for (t, _), k in zip(known, cl)}  # task id -> k(i)
        self.mu_global = cfg.mu0  # method §2 step 5: starts at 0.8
        self.A, self.V = np.zeros(self.K), np.zeros(self.K)  # per cluster: EMAs of success and its variance
        self.N = np.zeros(self.K)  # groups with a kept episode seen per cluster
        self.last_p, self.succ = {}, {}  # task id -> its last group mean; an EMA of it (online clusters)
        self.probe_rollouts = self.step = self.n_updates = 0
        self.rule = RULES[self.name](self)

    def mu_sigma(self, k):
        """Step 2: mu_k = clip(mu_global + lambda (p_target - A_k), 0, 1); sigma_k = max(gamma V_k,
        sigma_min). [released] cap < 1 and --sigma_mode fixed (sigma_fixed)."""
        c = self.cfg
        mu = float(np.clip(self.mu_global + c.lam * (c.p_target - self.A[k]), 0.0, c.cap))
        sigma = max(c.gamma * self.V[k], c.sigma_min) if c.sigma_mode == "dynamic" else c.sigma_fixed
        return mu, float(sigma)

    def draw(self, mu, sigma):
        """z ~ N(mu, sigma^2), r = clip(z, 0, 1) (released: [0, cap]). Ablations: SAMPLERS (uniform, none)."""
        z = (self.rng.normal(mu, sigma) if self.cfg.sampling == "gaussian"
             else SAMPLERS[self.cfg.sampling](self, mu, sigma))
        return float(np.clip(z, 0.0, self.cfg.cap))

    def prefix(self, r, task):  # ratio -> prefix steps (released: in token units, with its step cap)
        if self.cfg.prefix_unit == "token":
            return prefix_len(r, task["L"], task["tok_cum"], self.cfg.max_steps)
        return prefix_len(r, task["L"])

    def depths(self, tasks, step, probe=None):
        """One depth per task, shared by its R rollouts. tasks: [{"id", "L" (None: no hint yet -> 0),
        "tok_cum" (token units only)}] -> {"n": [...], "r": [...], "probe_rollouts": extra rollouts beyond |B|
        R}."""
        c = self.cfg
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        for t in tasks:
            if t["L"] is not None and t["L"] < 1:
                raise ValueError(f"task {t['id']}: expert length L must be >= 1, got {t['L']}")
        if c.prefix_unit == "token" and any("tok_cum" not in t for t in tasks if t["L"]):
            raise ValueError("prefix_unit 'token' needs each task's tok_cum "
                             "(token_offsets of its walkthrough)")
        if c.cluster_mode == "online" and step > 0 and step % c.recluster_every == 0:
            recluster(self)  # [beyond]
        hinted = [j for j, t in enumerate(tasks) if t["L"]]
        n, spent = [0] * len(tasks), 0
        if self.rule.probe:  # [baseline] probe rules see the hinted tasks only
            got, spent = self.rule.depths(tasks, step, probe)
            n = got
        else:
            for j in hinted:
                n[j] = self.rule.depth(tasks[j], step)
        if self.rule.g2 and c.hybrid_probe:
            n, spent = hybrid_probe(self, tasks, n, probe, step)  # [beyond]
        self.probe_rollouts += spent
        self.step = step
        return {"n": n, "r": [ni / t["L"] if t["L"] else 0.0 for ni, t in zip(n, tasks)],
                "probe_rollouts": spent}

    def update(self, task_ids, p_hat, flags=None):
        """Step 5, from the same batch: acc_B = mean success; mu_global += sign(p_target - acc_B) Delta,
        clipped to [0, 1]; for every cluster in the batch A_k <- (1 - alpha) A_k + alpha mean(p_i), V_k
        likewise with var(p_i). p_hat[i]: task i's mean success over its kept episodes, None when it has none
        (every episode hit an environment error): such a task says nothing and moves nothing
        [ZJU-REAL/Agent-G2 gmsv/alfworld.py, _update_scoreboard]. flags[i]: those episodes' 0/1 outcomes
        ([released] statistics over trajectories)."""
        c = self.cfg
        if len(p_hat) != len(task_ids) or len(task_ids) == 0:
            raise ValueError("update needs one success rate per task of the batch")
        if flags is not None and len(flags) != len(task_ids):
            raise ValueError("update needs one list of trajectory flags per task of the batch")
        kept = kept_tasks(task_ids, p_hat, flags)
        if not kept:
            return
        ids, p = [task_ids[i] for i in kept], np.array([float(p_hat[i]) for i in kept])
        f = None if flags is None else [np.asarray(flags[i], dtype=float) for i in kept]
        # acc_B over trajectories (a task with more kept episodes weighs more; without flags the mean of the
        # task means) [ZJU-REAL/Agent-G2 gmsv/alfworld.py, update_after_train_batch: the mean over rollouts]
        acc = float(np.concatenate(f).mean()) if f is not None else float(p.mean())
        self.n_updates += 1
        step = (c.Delta * float(np.sign(c.p_target - acc)) if c.mu_update == "sign"
                else MU_UPDATES[c.mu_update](c, acc))
        self.mu_global = float(np.clip(self.mu_global + step, 0.0, c.cap))
        ks = np.array([self.cluster[t] for t in ids])
        for k in np.unique(ks):  # only the clusters with a kept episode in the batch move
            x = cluster_values(c, p, f, ks == k)  # the task means (paper) or [released] the 0/1 flags
            self.A[k] = (1 - c.alpha) * self.A[k] + c.alpha * x.mean()
            self.V[k] = (1 - c.alpha) * self.V[k] + c.alpha * x.var()  # population variance, as np.var there
            self.N[k] += int(np.sum(ks == k))
        for t, pi in zip(ids, p):
            self.last_p[t] = float(pi)
            self.succ[t] = float(pi) if t not in self.succ else 0.5 * self.succ[t] + 0.5 * float(pi)
        self.rule.update(ids, p, f, acc)

    def set_length(self, task_id, L):
        """A hint source found (or shortened) task task_id's trajectory: its cluster follows its new length
        under the thresholds chosen at the start (random and online clusters keep theirs)."""
        if task_id not in self.cluster or self.cfg.cluster_mode not in ("random", "online"):
            self.cluster[task_id] = int(np.searchsorted(self.thresholds, float(L), side="left"))

    # ---- logging and checkpoints ----
    def stats(self):
        """What the log shows: the shared statistics, each cluster's mu / sigma as the rule draws them,
        the rule's own."""
        ms = [self.rule.mu_sigma(k, self.step) for k in range(self.K)]
        return {"mu_global": self.mu_global, "A": self.A.tolist(), "V": self.V.tolist(),
                "mu_k": [m for m, _ in ms], "sigma_k": [s for _, s in ms],
                "thresholds": list(self.thresholds), "probe_rollouts_total": self.probe_rollouts,
                **self.rule.stats()}

    FIXED = ("cfg", "name", "K", "ids", "rule")  # set by __init__ from its arguments, never changed

    def state_dict(self):
        """Every attribute but FIXED (a new one is saved without a line here) and the rule's own state,
        JSON-able (encode_state: numpy arrays and int-keyed dicts keep their types); the RNG as its state."""
        sd = {k: v.bit_generator.state if k == "rng" else v
              for k, v in vars(self).items() if k not in self.FIXED}
        return {**encode_state(sd, "scheduler"), "rule": encode_state(self.rule.state(), f"rule {self.name}")}

    def load_state_dict(self, sd):
        if "rule" not in sd:
            raise ValueError("scheduler state without a 'rule' entry: a checkpoint written before rules "
                             "owned their state; it cannot be resumed with this version")
        for k, v in decode_state({k: v for k, v in sd.items() if k != "rule"}).items():
            if k == "rng":
                self.rng.bit_generator.state = v
            else:
                setattr(self, k, v)
        self.rule.load(decode_state(sd["rule"]))


def kept_tasks(task_ids, p_hat, flags):
    """Indices of the tasks with a kept episode (a stand-in 0.0 for none must not count as a failure)."""
    kept = []
    for i, pi in enumerate(p_hat):
        if flags is not None and len(flags[i]) == 0:
            continue
        if pi is None:
            if flags is not None:
                raise ValueError(f"task {task_ids[i]}: p_hat is None but it has trajectory flags {flags[i]}")
            continue
        kept.append(i)
    p = np.array([float(p_hat[i]) for i in kept])
    if np.any(~np.isfinite(p)) or np.any(p < 0) or np.any(p > 1):
        raise ValueError(f"success rates must lie in [0, 1], got {p.tolist()}")
    return kept


class Rule:
    """A depth rule: one instance per Scheduler (self.s: its cfg, rng, cluster, A, V, N, mu_sigma, draw,
    prefix), holding any state of its own, which the scheduler saves and restores with it (encode_state).
    Subclass it, set name / help (and knobs {flag: (default, help)}: config fields the rule reads as
    self.s.cfg.<flag>; g2 = True for the Agent-G² family: the hybrid probe, eval.py diagnose's state replay)
    and decorate it with @register.
    probe = True rules implement depths(tasks, step, probe) -> (n list, extra rollouts) instead of depth."""
    name, help, knobs, probe, g2 = "", "", {}, False, False

    def __init__(self, s):
        self.s = s

    def depth(self, task, step):  # -> expert steps n to replay for one task
        raise NotImplementedError

    def update(self, ids, p, flags, acc):  # after the shared statistics moved (the batch's kept tasks)
        pass

    def mu_sigma(self, k, step):  # the centre and spread cluster k draws from: what the log shows
        return self.s.mu_sigma(k)

    def stats(self):  # extra fields for the log
        return {}

    def state(self):  # every attribute but the scheduler
        return {k: v for k, v in vars(self).items() if k != "s"}

    def load(self, sd):
        vars(self).update(sd)


def freeze_knobs():
    """Called by config.py once Config has its fields: a rule registered later cannot add a flag."""
    global knobs_frozen
    knobs_frozen = True


def register(cls):
    """Add a Rule subclass to RULES (and its knobs to the config)."""
    if cls.knobs and knobs_frozen:
        raise RuntimeError(f"rule {cls.name!r} with knobs: config.Config is already built; register rules "
                           "with their own flags in scheduler.py itself")
    RULES[cls.name] = cls
    KNOBS.update(cls.knobs)
    return cls


def is_g2(name):
    return name in RULES and RULES[name].g2


@register
class G2(Rule):
    name, g2 = "g2", True
    help = "Agent-G²: per-cluster Gaussian ratio around mu_global + lam (p_target - A_k)"

    def depth(self, task, step):  # one draw r ~ N(mu_k, sigma_k^2) per task
        return self.s.prefix(self.s.draw(*self.s.mu_sigma(self.s.cluster[task["id"]])), task)


def encode_state(value, where):
    """A JSON-able copy of a state value: numpy arrays as {"__ndarray__": list, "dtype"}, dicts with int keys
    as {"__int_keys__": [[k, v], ...]}, lists and str-keyed dicts recursively, numpy scalars as Python
    numbers. Anything else (a tuple, a set, an object) is refused with a clear error rather than coming back
    as something else."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if value and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in value):
            return {"__int_keys__": [[int(k), encode_state(v, f"{where}[{k}]")] for k, v in value.items()]}
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where}: dict keys must be all str or all int to be saved, "
                            f"got {sorted(map(repr, value))[:3]}")
        return {k: encode_state(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [encode_state(v, f"{where}[{j}]") for j, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where}: a {type(value).__name__} cannot be saved in a checkpoint; keep state in "
                    "numpy arrays, lists, dicts and numbers")


def decode_state(value):
    """encode_state's inverse."""
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.array(value["__ndarray__"], dtype=value["dtype"])
        if "__int_keys__" in value:
            return {k: decode_state(v) for k, v in value["__int_keys__"]}
        return {k: decode_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_state(v) for v in value]
    return value


# ============================================================================================================
# [released] the authors' code (method §2.1): balanced clusters, token units, the dead band, trajectory
# statistics; the cap (--cap) and a fixed sigma (--sigma_mode fixed) are in mu_sigma and draw above
# ============================================================================================================
def render_prefix(actions):
    """[released] The expert prefix as the released code renders it to measure tokens: "Step i: action" lines
    numbered from 1, joined by "\n" [ZJU-REAL/Agent-G2 gmsv/alfworld.py, format_expert_prefix]."""
    return "\n".join(f"Step {i}: {a}" for i, a in enumerate(actions, start=1))


def token_offsets(tok, walkthrough):
    """[released] offsets[j - 1] = token length of the rendered j-step prefix, i.e. the end of step j's line
    in the joined text. Each prefix is encoded as one text (BPE merges across the "\n"; summed per-line counts
    drift); actions are stripped as the authors strip them [ZJU-REAL/Agent-G2 gmsv/alfworld.py,
    build_step_end_offsets]."""
    acts = [str(a).strip() for a in walkthrough]
    return [len(tok.encode(render_prefix(acts[:j]), add_special_tokens=False))
            for j in range(1, len(acts) + 1)]


def token_prefix_len(r, L, tok_cum, max_steps=None):
    """[released] The target is floor(r * total tokens); 0 tokens -> no prefix, the whole prefix -> L steps,
    else the first step whose line ends at or past the target; then at most min(L - 1, max_steps - 1), so the
    policy keeps a step [ZJU-REAL/Agent-G2 gmsv/alfworld.py, GMSVAlfworldPrefixRuntime._sample_plan]."""
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
    """[released] "auto" difficulty groups: K-1 thresholds from expert lengths. Over the sorted unique
    lengths, every choice of K-1 cut points is tried; the kept one minimises (largest cluster - smallest, then
    sum |size - N/K|), ties to the first choice in itertools.combinations order. Threshold k = the largest
    length of cluster k. With fewer unique lengths than K: int() of the quantiles 1/(K-1), ..., 1, strictly
    increasing ones only, padded with the last [ZJU-REAL/Agent-G2 gmsv/alfworld.py,
    _compute_group_thresholds]."""
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
    # cum[b]: tasks with one of the b shortest lengths
    N, cum = len(v), np.concatenate([[0], np.cumsum(counts)])
    best, best_score = (), None
    # a cut b: a new cluster starts at the b-th unique length
    for cuts in combinations(range(1, len(u)), K - 1):
        edges = (0, *cuts, len(u))
        sizes = [int(cum[b] - cum[a]) for a, b in zip(edges, edges[1:])]
        # same float sum as theirs: same ties
        score = (max(sizes) - min(sizes), sum(abs(s - N / K) for s in sizes))
        if best_score is None or score < best_score:
            best, best_score = cuts, score
    return [float(u[b - 1]) for b in best]


def _thresholded(thresholds):  # a clustering by fixed thresholds: -> (cluster ids, thresholds)
    return lambda v, K, rng: (np.searchsorted(thresholds(v, K), v, side="left"), list(thresholds(v, K)))


CLUSTERINGS = {  # make_clusters' modes beyond the paper's quantiles
    "balanced": _thresholded(lambda v, K: [float(t) for t in balanced_thresholds(v, K)]),  # [released]
    # [released] the WebShop launcher's difficulty_group_mode=webshop_3: L <= 4 | 5 | >= 6
    # [ZJU-REAL/Agent-G2 gmsv/webshop.py, _compute_webshop_three_group_thresholds]
    "webshop_3": _thresholded(lambda v, K: [4.0, 5.0]),
    "random": lambda v, K, rng: (rng.permutation(len(v)) % K, []),  # [baseline] the ablation
}
MU_UPDATES = {  # mu_global's step beyond the paper's sign rule, from acc_B
    # [released] +- Delta only outside the dead band [acc_low, acc_high] (the launchers: 0.5 / 0.5)
    "deadband": lambda c, acc: c.Delta if acc < c.acc_low else -c.Delta if acc > c.acc_high else 0.0,
    "proportional": lambda c, acc: c.kp * (c.p_target - acc),  # [beyond]
}


def cluster_values(c, p, flags, members):
    """The values a cluster's A_k / V_k average: its tasks' means (paper) or [released] --stats_level traj,
    their trajectories' 0/1 outcomes."""
    if c.stats_level == "traj" and flags is not None:
        return np.concatenate([flags[j] for j in np.flatnonzero(members)])
    return p[members]


# ============================================================================================================
# [baseline] the depth rules the paper compares with (method §3, §4)
# ============================================================================================================
SAMPLERS = {  # [baseline] the sampling ablations beside the Gaussian
    # uniform with the same variance: U(mu - sqrt(3) sigma, mu + sqrt(3) sigma)
    "uniform": lambda s, mu, sigma: s.rng.uniform(mu - math.sqrt(3) * sigma, mu + math.sqrt(3) * sigma),
    "none": lambda s, mu, sigma: mu,  # sigma_i = 0
}


def _progress(s, step):
    return min(step, s.cfg.steps - 1) / max(s.cfg.steps - 1, 1)


def simple_rule(name, help, depth):
    """[baseline] A stateless rule from its depth function depth(s, task, step)."""
    return register(type(f"Rule_{name}", (Rule,),
                         {"name": name, "help": help,
                          "depth": lambda self, task, step: depth(self.s, task, step)}))


simple_rule("none", "plain GRPO: no hint", lambda s, t, step: 0)
simple_rule("fixed", "ratio --fixed_ratio throughout", lambda s, t, step: s.prefix(s.cfg.fixed_ratio, t))
simple_rule("linear", "ratio 1 -> 0 linearly over --steps",
            lambda s, t, step: s.prefix(1.0 - _progress(s, step), t))
simple_rule("cosine", "ratio cos(pi/2 * progress)",
            lambda s, t, step: s.prefix(max(0.0, math.cos(math.pi / 2 * _progress(s, step))), t))
simple_rule("step", "L-1 steps, one fewer every --step_every",
            lambda s, t, step: max(t["L"] - 1 - step // s.cfg.step_every, 0))


@register
class TargetAcc(Rule):
    name, help = "target_acc", "L-1 steps, one fewer after each batch with accuracy >= 0.5"

    def __init__(self, s):
        super().__init__(s)
        self.d = 0  # the counter: grows by one after every batch whose accuracy is >= 0.5, never shrinks

    def depth(self, task, step):
        return max(task["L"] - 1 - self.d, 0)

    def update(self, ids, p, flags, acc):
        self.d += int(acc >= 0.5)

    def stats(self):
        return {"d": self.d}


def _closest(s, tried):  # the probed depth with successes closest to R/2 (ties: the shallower)
    return min(tried, key=lambda n: (abs(tried[n] - s.cfg.group_size / 2), n))


@register
class Binary(Rule):
    name, help, probe = "binary", "binary search of the depth by probe groups", True

    def depths(self, tasks, step, probe):
        s, c = self.s, self.s.cfg
        target, hinted = c.group_size / 2, [j for j, t in enumerate(tasks) if t["L"]]
        lo = {j: 0 for j in hinted}
        hi = {j: min(tasks[j]["L"] - 1, c.max_steps - 1) for j in hinted}
        tried = {j: {} for j in hinted}
        active = list(hinted)
        while active:
            pairs = [(i, (lo[i] + hi[i]) // 2) for i in active]
            for (i, mid), got in zip(pairs, probe(pairs)):
                tried[i][mid] = got
                if got < target:
                    lo[i] = mid + 1  # too hard: more expert steps
                elif got > target:
                    hi[i] = mid - 1
                else:
                    hi[i] = lo[i] - 1  # exactly on target: stop
            active = [i for i in active if lo[i] <= hi[i] and len(tried[i]) < c.max_probes
                      and (lo[i] + hi[i]) // 2 not in tried[i]]
        spent = sum(len(t) - 1 for t in tried.values()) * c.group_size
        return [_closest(s, tried[j]) if j in tried else 0 for j in range(len(tasks))], spent


@register
class Enum(Rule):
    name, help, probe = "enum", "every depth of a grid probed, the closest to R/2 kept", True

    def depths(self, tasks, step, probe):
        s, c = self.s, self.s.cfg
        grids = {}
        for j, t in enumerate(tasks):
            if not t["L"]:
                continue
            top = min(t["L"] - 1, c.max_steps - 1)
            g = ({min(prefix_len(r, t["L"]), top) for r in np.arange(0, 1 + 1e-9, c.enum_grid)}
                 if c.enum_grid > 0 else set(range(top + 1)))
            grids[j] = sorted(g)
        pairs = [(i, n) for i, g in grids.items() for n in g]
        tried = {j: {} for j in grids}
        for (i, n), got in zip(pairs, probe(pairs)):
            tried[i][n] = got
        return [_closest(s, tried[j]) if j in tried else 0 for j in range(len(tasks))], \
            (len(pairs) - len(grids)) * c.group_size


# ============================================================================================================
# [beyond] rules beyond the paper: exploration on the centre, a two-component mixture, online clusters, the
# hybrid probe (the proportional mu_global update is in MU_UPDATES above)
# ============================================================================================================
@register
class G2UCB(Rule):
    name, g2 = "g2_ucb", True
    help = "Agent-G² with an exploration bonus on the centre: mu_k + ucb_c sqrt(log(t+1) / (n_k+1))"
    knobs = {"ucb_c": (0.1, "--scheduler g2_ucb: exploration bonus weight on the cluster centre")}

    def mu_sigma(self, k, step):  # the centre it draws from, bonus included
        mu, sigma = self.s.mu_sigma(k)
        bonus = self.s.cfg.ucb_c * math.sqrt(math.log(step + 1) / (self.s.N[k] + 1))
        return min(mu + bonus, self.s.cfg.cap), sigma

    def depth(self, task, step):
        return self.s.prefix(self.s.draw(*self.mu_sigma(self.s.cluster[task["id"]], step)), task)


@register
class G2Mix(Rule):
    """Per cluster two Gaussians, a shallow and a deep one, each with success / variance EMAs of its own from
    the tasks it drew: centres clip(mu_global + lam (p_target - A_kc) -+ mix_gap, 0, cap), spreads max(gamma
    V_kc, sigma_min), drawn with weights proportional to V_kc + 0.05 (the component whose groups disagree
    more, in the band, draws more). For a cluster whose tasks split into an easy and a hard half."""
    name, g2 = "g2_mix", True
    help = "Agent-G² with a two-component (shallow / deep) Gaussian mixture per cluster"
    knobs = {"mix_gap": (0.15, "--scheduler g2_mix: the components' centres sit mix_gap below / above mu_k")}

    def __init__(self, s):
        super().__init__(s)
        self.A, self.V = np.zeros((s.K, 2)), np.zeros((s.K, 2))  # [cluster, component]
        self.drawn = {}  # task id -> the component of its last draw

    def components(self, k):  # -> (centres [2], spreads [2], weights [2]) of cluster k
        s, c = self.s, self.s.cfg
        mus = np.clip(s.mu_global + c.lam * (c.p_target - self.A[k]) + np.array([-c.mix_gap, c.mix_gap]),
                      0.0, c.cap)
        return (mus, np.maximum(c.gamma * self.V[k], c.sigma_min),
                (self.V[k] + 0.05) / (self.V[k] + 0.05).sum())

    def depth(self, task, step):
        mus, sigmas, w = self.components(self.s.cluster[task["id"]])
        j = int(self.s.rng.random() < w[1])
        self.drawn[task["id"]] = j
        return self.s.prefix(self.s.draw(float(mus[j]), float(sigmas[j])), task)

    def update(self, ids, p, flags, acc):
        c = self.s.cfg
        comp = np.array([self.drawn.get(t, -1) for t in ids])
        ks = np.array([self.s.cluster[t] for t in ids])
        for k in np.unique(ks):
            for j in (0, 1):
                members = (ks == k) & (comp == j)
                if members.any():
                    x = cluster_values(c, p, flags, members)
                    self.A[k, j] = (1 - c.alpha) * self.A[k, j] + c.alpha * x.mean()
                    self.V[k, j] = (1 - c.alpha) * self.V[k, j] + c.alpha * x.var()

    def mu_sigma(self, k, step):  # the mixture's mean and standard deviation
        mus, sigmas, w = self.components(k)
        mean = float(w @ mus)
        return mean, math.sqrt(max(float(w @ (sigmas ** 2 + mus ** 2)) - mean ** 2, 0.0))


def recluster(s):
    """[beyond] Online clusters (--cluster_mode online): quantiles of 1 - rolling success, every
    --recluster_every steps; a task not seen yet takes its cluster's A_k."""
    ids = [t for t in s.ids if t in s.cluster]
    score = [1.0 - s.succ.get(t, s.A[s.cluster[t]]) for t in ids]
    cl, s.thresholds = make_clusters(score, s.K, "online", s.rng)
    s.cluster.update({t: int(k) for t, k in zip(ids, cl)})


def hybrid_probe(s, tasks, n, probe, step=0):
    """[beyond] --hybrid_probe 1: a task whose last group was all-0 / all-1 first probes its sampled depth; if
    that group is degenerate too, it moves one sigma deeper / shallower (one extra group at most)."""
    c = s.cfg
    flagged = [i for i, t in enumerate(tasks) if t["L"] and s.last_p.get(t["id"]) in (0.0, 1.0)]
    if not flagged:
        return n, 0
    pairs = [(i, n[i]) for i in flagged]
    spent = 0
    for (i, ni), got in zip(pairs, probe(pairs)):
        if 0 < got < c.group_size:
            continue  # in band: the probe group is the policy group, no extra cost
        L, k = tasks[i]["L"], s.cluster[tasks[i]["id"]]
        shift = s.rule.mu_sigma(k, step)[1] * (1 if got == 0 else -1)
        n[i] = s.prefix(float(np.clip(ni / L + shift, 0, c.cap)), tasks[i])
        spent += c.group_size
    return n, spent
