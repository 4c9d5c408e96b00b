"""[beyond] Agent-G² with a hint-free share: each step a fixed share of the batch's tasks is played from the
start (n = 0, as plain GRPO plays every task), the rest at Agent-G²'s depths. It asks whether hinted training
lacks practice of the search phase, the steps before the expert prefix ends (docs/results.md §9, explanation
(b)). Not the paper's rule: a labelled row of its own.

    python train.py --preset cpu_mix6 --scheduler g2_hint_free [--hint_free_share 0.5]

Which tasks go hint-free is drawn each step from a stream of its own (seed, step), after Agent-G² has drawn
every task's depth, so the other tasks get the depths plain Agent-G² would draw from the same state. The
hint-free tasks' outcomes leave the rule's statistics alone (A_k, V_k and mu_global describe hinted play)."""
import numpy as np

from scheduler import G2


class G2HintFree(G2):
    name = "g2_hint_free"
    help = "Agent-G² with a share of each batch played hint-free (n = 0)"
    flags = ("hint_free_share",)  # the paper's rule beneath (scheduler.G2), not the released code's flags
    probes = False  # plays no probe groups (variants/players.py)

    FIXED = G2.FIXED + ("seed", "free")  # not saved: the run's seed, and the step's own pick

    def __init__(self, cfg, task_ids, lengths, seed=0, tok=None):
        super().__init__(cfg, task_ids, lengths, seed, tok)
        self.seed, self.free = seed, set()  # free: the ids played hint-free this step (read by its update)

    def depths(self, tasks, step, probe=None):
        plan = super().depths(tasks, step, probe)
        hinted = [i for i, t in enumerate(tasks) if t["L"]]
        k = int(round(self.cfg.hint_free_share * len(hinted)))
        pick = np.random.default_rng([self.seed, step]).permutation(len(hinted))[:k]
        free = sorted(hinted[j] for j in pick)
        for i in free:
            plan["n"][i], plan["r"][i] = 0, 0.0
        self.free = {tasks[i]["id"] for i in free}
        return plan

    def update(self, task_ids, p_hat, flags=None):
        keep = [i for i, t in enumerate(task_ids) if t not in self.free]
        if not keep:
            return None
        return super().update([task_ids[i] for i in keep], [p_hat[i] for i in keep],
                              None if flags is None else [flags[i] for i in keep])
