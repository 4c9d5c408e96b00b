"""Depth rules beyond the paper's Agent-G² (scheduler.G2), each a subclass looked up by name once at setup
(scheduler.make_rule through config.variant; --scheduler's choices come from REGISTRY). Three kinds, each
tagged where it sits:
  [released]  the authors' code (docs/method.md §2.1): token units, balanced clusters, the dead band, the
              cap, statistics over trajectories (Configured: --scheduler g2 with any of their flags);
  [baseline]  the schedules and probes the paper compares with (§3, §4): none, fixed, linear, cosine, step,
              target_acc, binary, enum, and random clusters;
  [beyond]    rules beyond the paper: online clusters, the proportional mu_global update, the hybrid probe,
              g2_ucb, g2_mix.
A rule of your own: subclass Configured (or scheduler.G2), override depth(task, step) (and update, mu_sigma,
stats as needed), and select it with --scheduler my_file:MyRule (README "Hack it"). `python -m tools.bench
sched` simulates every rule side by side.
"""
import math
from itertools import combinations

import numpy as np

from scheduler import G2, make_clusters, prefix_len
from variants.hint_free import G2HintFree  # a rule in a file of its own


# ============================================================================================================
# [released] the authors' code (method §2.1)
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


CLUSTERINGS = {  # make_clusters' modes beyond the paper's quantiles: (values, K, rng) -> (ids, thresholds)
    "balanced": _thresholded(lambda v, K: [float(t) for t in balanced_thresholds(v, K)]),  # [released]
    # [released] the WebShop launcher's difficulty_group_mode=webshop_3: L <= 4 | 5 | >= 6
    # [ZJU-REAL/Agent-G2 gmsv/webshop.py, _compute_webshop_three_group_thresholds]
    "webshop_3": _thresholded(lambda v, K: [4.0, 5.0]),
    "random": lambda v, K, rng: (rng.permutation(len(v)) % K, []),  # [baseline] the ablation
}
def cluster_ids(values, K, mode, rng):
    """Cluster ids and thresholds under any --cluster_mode (quantile and online: scheduler.make_clusters)."""
    if mode in ("quantile", "online"):
        return make_clusters(values, K)
    if mode not in CLUSTERINGS:
        raise ValueError(f"unknown cluster mode {mode!r}")
    return CLUSTERINGS[mode](np.asarray(values, dtype=float), K, rng)


MU_UPDATES = {  # mu_global's step, from acc_B: the paper's sign rule and the others
    "sign": lambda c, acc: c.Delta * float(np.sign(c.p_target - acc)),
    # [released] +- Delta only outside the dead band [acc_low, acc_high] (the launchers: 0.5 / 0.5)
    "deadband": lambda c, acc: c.Delta if acc < c.acc_low else -c.Delta if acc > c.acc_high else 0.0,
    "proportional": lambda c, acc: c.kp * (c.p_target - acc),  # [beyond]
}


class Configured(G2):
    """Agent-G² under every flag of the released code and beyond the paper: --cluster_mode balanced | random
    | online | webshop_3, --cap, --mu_update deadband | proportional, --stats_level traj, --prefix_unit
    token, --hybrid_probe. Every other rule here subclasses it, so those flags apply to them too."""
    help = "Agent-G²: per-cluster Gaussian ratio around mu_global + lam (p_target - A_k)"
    flags = ()  # the rule's own config fields (a warning when set under another --scheduler)

    def __init__(self, cfg, task_ids, lengths, seed=0, tok=None):
        super().__init__(cfg, task_ids, lengths, seed, tok)
        self.N = np.zeros(self.K)  # groups with a kept episode seen per cluster (g2_ucb's count)
        self.last_p, self.succ = {}, {}  # task id -> its last group mean (hybrid probe); an EMA (online)
        self.tok_cum_cache = {}  # [released] token units: hint actions (joined) -> token offsets

    @property
    def probes(self):  # the rule asks for probe groups before its depths are fixed (variants/players.py)
        return self.g2 and self.cfg.hybrid_probe

    def clusters(self, lengths):  # online: quantiles of length until the first re-clustering
        return cluster_ids(lengths, self.K, self.cfg.cluster_mode, self.rng)

    def mu_sigma(self, k, step=0):  # [released] the centre capped at --cap (0.8)
        mu, sigma = super().mu_sigma(k, step)
        return min(mu, self.cfg.cap), sigma

    def draw(self, mu, sigma):  # [released] the ratio capped at --cap
        return min(super().draw(mu, sigma), self.cfg.cap)

    def prefix(self, r, task):  # [released] --prefix_unit token: the ratio of the rendered prefix's tokens
        if self.cfg.prefix_unit != "token":
            return prefix_len(r, task["L"])
        prefix_len(r, task["L"])  # the same checks of r and L
        return token_prefix_len(r, task["L"], self.tok_cum(task), self.cfg.max_steps)

    def tok_cum(self, task):
        if "tok_cum" in task:
            return task["tok_cum"]
        if self.tok is None or "actions" not in task:
            raise ValueError("prefix_unit 'token' needs each task's tok_cum (token_offsets of its "
                             "walkthrough): a tokenizer and the task's hint actions")
        key = "\n".join(task["actions"])
        if key not in self.tok_cum_cache:
            self.tok_cum_cache[key] = token_offsets(self.tok, task["actions"])
        return self.tok_cum_cache[key]

    def depths(self, tasks, step, probe=None):
        c = self.cfg
        if c.cluster_mode == "online" and step > 0 and step % c.recluster_every == 0:
            recluster(self)  # [beyond]
        plan = self.probe_depths(tasks, step, probe)
        if self.g2 and c.hybrid_probe:  # [beyond]
            plan["n"], spent = hybrid_probe(self, tasks, plan["n"], probe, step)
            plan["probe_rollouts"] += spent
            plan["r"] = [ni / t["L"] if t["L"] else 0.0 for ni, t in zip(plan["n"], tasks)]
        self.probe_rollouts += plan["probe_rollouts"]
        return plan

    def probe_depths(self, tasks, step, probe):  # the probe rules replace this
        return super().depths(tasks, step, probe)

    def update(self, task_ids, p_hat, flags=None):
        c, mu_before = self.cfg, self.mu_global
        got = super().update(task_ids, p_hat, flags)
        if got is None:
            return None
        ids, p, f, acc = got
        # the same arithmetic as the paper's, with the configured step and cap
        self.mu_global = float(np.clip(mu_before + MU_UPDATES[c.mu_update](c, acc), 0.0, c.cap))
        ks = np.array([self.cluster[t] for t in ids])
        for k in np.unique(ks):
            self.N[k] += int(np.sum(ks == k))
        for t, pi in zip(ids, p):
            self.last_p[t] = float(pi)
            self.succ[t] = float(pi) if t not in self.succ else 0.5 * self.succ[t] + 0.5 * float(pi)
        return got

    def cluster_values(self, p, flags, members):  # [released] --stats_level traj: the 0/1 trajectory outcomes
        if self.cfg.stats_level == "traj" and flags is not None:
            return np.concatenate([flags[j] for j in np.flatnonzero(members)])
        return p[members]

    def batch_acc(self, p, flags):  # [released] --stats_level traj: acc_B over the 0/1 trajectory outcomes,
        # the whole batch's accuracy [ZJU-REAL/Agent-G2 gmsv/alfworld.py update_after_train_batch]
        if self.cfg.stats_level == "traj" and flags is not None:
            return float(np.concatenate(flags).mean())
        return super().batch_acc(p, flags)

    def set_length(self, task_id, L):  # random and online clusters keep theirs
        if task_id not in self.cluster or self.cfg.cluster_mode not in ("random", "online"):
            super().set_length(task_id, L)


# ============================================================================================================
# [baseline] the depth rules the paper compares with (method §3, §4)
# ============================================================================================================
class Baseline(Configured):
    """A schedule that is not Agent-G²: the shared statistics are kept and logged, the depth is its own."""
    g2 = False


def _progress(s, step):
    return min(step, s.cfg.steps - 1) / max(s.cfg.steps - 1, 1)


def simple_rule(name, help, depth):
    """[baseline] A stateless rule from its depth function depth(rule, task, step)."""
    return type(f"Rule_{name}", (Baseline,), {"name": name, "help": help, "depth": depth})


NoHint = simple_rule("none", "plain GRPO: no hint", lambda s, t, step: 0)
Fixed = simple_rule("fixed", "ratio --fixed_ratio throughout",
                    lambda s, t, step: s.prefix(s.cfg.fixed_ratio, t))
Linear = simple_rule("linear", "ratio 1 -> 0 linearly over --steps",
                     lambda s, t, step: s.prefix(1.0 - _progress(s, step), t))
Cosine = simple_rule("cosine", "ratio cos(pi/2 * progress)",
                     lambda s, t, step: s.prefix(max(0.0, math.cos(math.pi / 2 * _progress(s, step))), t))
Step = simple_rule("step", "L-1 steps, one fewer every --step_every",
                   lambda s, t, step: max(t["L"] - 1 - step // s.cfg.step_every, 0))


class TargetAcc(Baseline):
    name, help = "target_acc", "L-1 steps, one fewer after each batch with accuracy >= 0.5"

    def __init__(self, *args):
        super().__init__(*args)
        self.d = 0  # the counter: grows by one after every batch whose accuracy is >= 0.5, never shrinks

    def depth(self, task, step):
        return max(task["L"] - 1 - self.d, 0)

    def update(self, task_ids, p_hat, flags=None):
        got = super().update(task_ids, p_hat, flags)
        if got is not None:
            self.d += int(got[3] >= 0.5)
        return got

    def stats(self):
        return {**super().stats(), "d": self.d}


def _closest(s, tried):  # the probed depth with successes closest to R/2 (ties: the shallower)
    return min(tried, key=lambda n: (abs(tried[n] - s.cfg.group_size / 2), n))


class Binary(Baseline):
    name, help, probes = "binary", "binary search of the depth by probe groups", True

    def probe_depths(self, tasks, step, probe):
        self.step = step
        c = self.cfg
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
        return plan_of([_closest(self, tried[j]) if j in tried else 0 for j in range(len(tasks))], tasks,
                       spent)


class Enum(Baseline):
    name, help, probes = "enum", "every depth of a grid probed, the closest to R/2 kept", True

    def probe_depths(self, tasks, step, probe):
        self.step = step
        c = self.cfg
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
        return plan_of([_closest(self, tried[j]) if j in tried else 0 for j in range(len(tasks))], tasks,
                       (len(pairs) - len(grids)) * c.group_size)


def plan_of(n, tasks, spent):
    return {"n": n, "r": [ni / t["L"] if t["L"] else 0.0 for ni, t in zip(n, tasks)], "probe_rollouts": spent}


# ============================================================================================================
# [beyond] rules beyond the paper: exploration on the centre, a two-component mixture, online clusters, the
# hybrid probe (the proportional mu_global update is in MU_UPDATES above)
# ============================================================================================================
class G2UCB(Configured):
    name = "g2_ucb"
    help = "Agent-G² with an exploration bonus on the centre: mu_k + ucb_c sqrt(log(t+1) / (n_k+1))"
    flags = ("ucb_c",)

    def mu_sigma(self, k, step=0):  # the centre it draws from, bonus included: what the log shows
        mu, sigma = super().mu_sigma(k, step)
        bonus = self.cfg.ucb_c * math.sqrt(math.log(step + 1) / (self.N[k] + 1))
        return min(mu + bonus, self.cfg.cap), sigma


class G2Mix(Configured):
    """Per cluster two Gaussians, a shallow and a deep one, each with success / variance EMAs of its own from
    the tasks it drew: centres clip(mu_global + lam (p_target - A_kc) -+ mix_gap, 0, cap), spreads max(gamma
    V_kc, sigma_min), drawn with weights proportional to V_kc + 0.05 (the component whose groups disagree
    more, in the band, draws more). For a cluster whose tasks split into an easy and a hard half."""
    name = "g2_mix"
    help = "Agent-G² with a two-component (shallow / deep) Gaussian mixture per cluster"
    flags = ("mix_gap",)

    def __init__(self, *args):
        super().__init__(*args)
        self.A_mix, self.V_mix = np.zeros((self.K, 2)), np.zeros((self.K, 2))  # [cluster, component]
        self.drawn = {}  # task id -> the component of its last draw

    def components(self, k):  # -> (centres [2], spreads [2], weights [2]) of cluster k
        c = self.cfg
        gap = np.array([-c.mix_gap, c.mix_gap])
        mus = np.clip(self.mu_global + c.lam * (c.p_target - self.A_mix[k]) + gap, 0.0, c.cap)
        return (mus, np.maximum(c.gamma * self.V_mix[k], c.sigma_min),
                (self.V_mix[k] + 0.05) / (self.V_mix[k] + 0.05).sum())

    def depth(self, task, step):
        mus, sigmas, w = self.components(self.cluster[task["id"]])
        j = int(self.rng.random() < w[1])
        self.drawn[task["id"]] = j
        return self.prefix(self.draw(float(mus[j]), float(sigmas[j])), task)

    def update(self, task_ids, p_hat, flags=None):
        got = super().update(task_ids, p_hat, flags)
        if got is None:
            return None
        (ids, p, f, _), c = got, self.cfg
        comp = np.array([self.drawn.get(t, -1) for t in ids])
        ks = np.array([self.cluster[t] for t in ids])
        for k in np.unique(ks):
            for j in (0, 1):
                members = (ks == k) & (comp == j)
                if members.any():
                    x = self.cluster_values(p, f, members)
                    self.A_mix[k, j] = (1 - c.alpha) * self.A_mix[k, j] + c.alpha * x.mean()
                    self.V_mix[k, j] = (1 - c.alpha) * self.V_mix[k, j] + c.alpha * x.var()
        return got

    def mu_sigma(self, k, step=0):  # the mixture's mean and standard deviation
        mus, sigmas, w = self.components(k)
        mean = float(w @ mus)
        return mean, math.sqrt(max(float(w @ (sigmas ** 2 + mus ** 2)) - mean ** 2, 0.0))


def recluster(s):
    """[beyond] Online clusters (--cluster_mode online): quantiles of 1 - rolling success, every
    --recluster_every steps; a task not seen yet takes its cluster's A_k."""
    ids = [t for t in s.ids if t in s.cluster]
    score = [1.0 - s.succ.get(t, s.A[s.cluster[t]]) for t in ids]
    cl, s.thresholds = make_clusters(score, s.K)
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
        shift = s.mu_sigma(k, step)[1] * (1 if got == 0 else -1)
        n[i] = s.prefix(float(np.clip(ni / L + shift, 0, c.cap)), tasks[i])
        spent += c.group_size
    return n, spent


REGISTRY = {"g2": Configured, **{cls.name: cls for cls in (NoHint, Fixed, Linear, Cosine, Step, TargetAcc,
                                                           Binary, Enum, G2UCB, G2Mix, G2HintFree)}}


def is_g2(name):
    """The Agent-G² family (the hybrid probe applies; eval.py diagnose replays its state)."""
    return name == "g2" or (name in REGISTRY and REGISTRY[name].g2)
