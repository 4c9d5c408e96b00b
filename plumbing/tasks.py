"""The tasks: a split's tasks from the configured environment's registry entry (envs.ENVS), the training
subset, the batch order, the checks of a step's size, and a warning for length clusters that can never hold a
task.

Contract. tasks_for(cfg, split) -> the split's tasks; batch_indices(step, B, n, seed): the step's |B| task
indices, a pure function of its arguments (the same on every rank and on resume); check_step: a step that
cannot run is a one-line error before any model loads.

    tasks = tasks_for(cfg, "train")   # [{"id", "gamefile", "task_type", "goal", "walkthrough", "L"
                                      #   (, "thinks")}]
    # the step's |B| tasks: a pure function of the step (resume)
    idx = batch_indices(step, B, len(tasks), seed)
    python envs.py stats              # split sizes + expert lengths (length_table)

Each environment loads its own splits: ALFWorld's games (plumbing/gamegen.py load_tasks: the built-in set in
data/alfworld_builtin.tar.gz, or the official games in $ALFWORLD_DATA/json_2.1.1), WebShop's goals
(plumbing/webshop.py load_webshop_tasks). A task's "walkthrough" is its expert trajectory: the game's own, or
the authors' expert data where --expert_data has an entry (plumbing/expert_data.py); WebShop's come from
that data or the scripted expert.
"""
import numpy as np

from envs import env_class
from plumbing.gamegen import length_table, load_tasks  # noqa: F401  (ALFWorld's loader; kept importable here)
from scheduler import make_clusters


def tasks_for(cfg, split, verbose=False):
    """The tasks of a split for the configured environment (--env: its entry's `tasks`). The training
    split's expert trajectories come from --expert_data where it has an entry (plumbing/expert_data.py),
    else from each task's own."""
    return env_class(cfg.env).tasks(cfg, split, verbose)


def train_subset(tasks, n):
    """--train_games: a fixed seeded subset of n tasks (all when n = 0), in split order; balanced over task
    types in expectation. The same subset in train.py and eval.py."""
    return [tasks[i] for i in sorted(np.random.default_rng(1234).permutation(len(tasks))[:n])] if n else tasks


def batch_indices(step, B, N, seed):
    """|B| task indices of a step: epoch-wise permutations of the N tasks seeded by (seed, epoch), read in
    order across epoch boundaries; a pure function of the step (a resumed run sees the same batches)."""
    idx, epoch = [], (step * B) // N
    while len(idx) < B:
        perm = np.random.default_rng([seed, epoch]).permutation(N)
        start = (step * B + len(idx)) - epoch * N
        idx += perm[start:start + B - len(idx)].tolist()
        epoch += 1
    return idx


class BatchOrder:
    """--task_sampler order (the default): batch_indices, a seeded pass over the training set. A task sampler
    is built at setup as Class(cfg, tasks) and asked every step, the same on every rank: batch(step) -> |B|
    indices into tasks; observe(task_ids, p_hat): the step's tasks and their success rates (None: no kept
    outcome); stats() -> a dict logged under "task_sampler"; state_dict() / load_state_dict(sd): JSON, saved
    in every checkpoint. Yours: --task_sampler file:Class (README "Hack it")."""

    def __init__(self, cfg, tasks):
        self.B, self.n, self.seed = cfg.batch_tasks, len(tasks), cfg.seed

    def batch(self, step):
        return batch_indices(step, self.B, self.n, self.seed)

    def observe(self, task_ids, p_hat):
        pass

    def stats(self):
        return {}

    def state_dict(self):
        return {}

    def load_state_dict(self, sd):
        pass


def make_sampler(cfg, tasks):
    """--task_sampler: order (BatchOrder) or file:Class (checked at start-up: plumbing/plugins.py)."""
    if cfg.task_sampler == "order":
        return BatchOrder(cfg, tasks)
    from plumbing.plugins import plugin
    return plugin("task_sampler", cfg.task_sampler)(cfg, tasks)


def check_step(cfg, tok, tasks, n_eval, world):
    """One-line errors (exit 2) for a step this run cannot hold, before the rollout engine starts:
    - |B| above the training set: a step's tasks come from a pass over the set without repeats (a task comes
      twice only where a batch straddles two passes); more rollouts of a task are --group_size;
    - more live episodes on one env worker than plumbing/pool.py's MAX_LIVE: a rank's groups (or its share of
      an evaluation's games) are dealt over --num_workers game by game (an estimate: a game twice in one call
      puts both on one worker, which then answers the resets past the bound with an error);
    - --max_prompt_tokens below the shortest prompt the run can build, the prompt around its shortest goal
      with no room, history, observation or actions: every prompt would be cut."""
    from config import fail
    from plumbing.pool import MAX_LIVE
    from rollout import chat_ids_batch, user_message
    if cfg.batch_tasks > len(tasks):
        fail(f"--batch_tasks {cfg.batch_tasks} exceeds the training set ({len(tasks)} tasks): a step's tasks "
             "come from one pass over it, each once; more rollouts per task are --group_size")
    up = lambda a, b: -(-a // b)  # noqa: E731  (ceil)
    live = max(up(up(cfg.batch_tasks, world), cfg.num_workers) * cfg.group_size,
               up(up(n_eval, world), cfg.num_workers))
    if live > MAX_LIVE:
        fail(f"one env worker would hold {live} live episodes at once, beyond its bound of {MAX_LIVE} "
             "(plumbing/pool.py MAX_LIVE): raise --num_workers or lower --batch_tasks or --group_size")
    goals = sorted({t.get("goal", "") for t in tasks})
    floor = min(map(len, chat_ids_batch(tok, [user_message(g, "", [], "", [], 0, cfg) for g in goals])))
    if cfg.max_prompt_tokens < floor:
        fail(f"--max_prompt_tokens {cfg.max_prompt_tokens} is below the shortest prompt this run can build "
             f"({floor} tokens: its shortest goal with no room, history, observation or actions); every "
             "prompt would be cut")


def start_lines(cfg, tasks, hints, lengths):
    """train.py's start-up lines: the training tasks' expert lengths (length_table), how many start with a
    hint to replay and with a text, and cluster_warning's line under quantile clusters (if any)."""
    lines = [length_table(tasks),
             f"[hints] {cfg.hint_source}: {sum(L is not None for L in lengths)} of {len(tasks)} training "
             f"tasks start with a hint to replay, {sum(bool(h and h.text) for h in hints)} with a text"]
    warning = cluster_warning(lengths, cfg.K) if cfg.cluster_mode == "quantile" else None
    return "\n".join(lines + ([warning] if warning else []))


def cluster_warning(lengths, K):
    """A one-line warning when K quantile clusters (scheduler.make_clusters) of these expert lengths leave a
    cluster empty, else None. Few distinct lengths make equal thresholds: lengths 4-7 under K = 3 can give
    [6, 6], and a cluster that never holds a task keeps its A_k, V_k at their start values forever."""
    lengths = [L for L in lengths if L]
    if not lengths or K < 2:
        return None
    ids, thresholds = make_clusters(lengths, K)
    empty = sorted(set(range(K)) - {int(k) for k in ids})
    if not empty:
        return None
    return (f"warning: --K {K} quantile clusters of {len(lengths)} expert lengths "
            f"({min(lengths)}-{max(lengths)}, {len(set(lengths))} distinct): thresholds "
            f"{[round(t, 2) for t in thresholds]} leave cluster(s) {', '.join(map(str, empty))} empty "
            "(their statistics never move); use a smaller --K or --cluster_mode balanced")
