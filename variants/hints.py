"""[beyond] Hint sources other than the paper's expert trajectories (rollout.ExpertSource), built once at
setup as Class(cfg, tasks) by rollout.make_hints through config.variant:

    self      the expert's hint where a task has one, else the shortest win the policy itself played for it
    mixed     each task's shorter of the two (an own win shorter than the expert's replaces it)
    dropped   --hint_source expert --drop_walkthroughs F: the expert's, less a fixed share of the tasks

SelfSource: the shortest winning trajectory the policy has played for the task, valid actions only, the
replayed prefix included (an invalid action leaves the state as it was, so skipping it replays the same
episode). A task with no hint yet is played at depth 0, and its group does not move the scheduler's statistics
(train.py). --drop_walkthroughs F treats a fixed, seeded share of the training tasks as having no expert
trajectory (self and mixed too). A source of your own (--hint_source my_file:MyClass) needs no entry here:
config.variant imports it, config.validate checks its four methods (rollout.ExpertSource documents them).
"""
import numpy as np

from rollout import ExpertSource, Hint


class SelfSource:
    """The shortest won trajectory the policy has played per task: its episodes' "played" actions (the
    replayed prefix and the valid actions after it). No thinks: its aux targets carry an empty one."""

    def __init__(self):
        self.best = {}  # task id -> actions

    def hint(self, task):
        return Hint(self.best[task["id"]], []) if task["id"] in self.best else None

    def observe(self, episodes):
        changed = []
        for e in episodes:
            if e["won"] and not e["error"] and (e["task_id"] not in self.best or
                                                len(e["played"]) < len(self.best[e["task_id"]])):
                self.best[e["task_id"]] = list(e["played"])
                changed.append(e["task_id"])
        return sorted(set(changed))

    def state_dict(self):
        return {"best": dict(self.best)}

    def load_state_dict(self, sd):
        self.best = {k: list(v) for k, v in sd["best"].items()}


class FirstOf:
    """The first source with a hint for the task (self: the expert's, else the policy's own win)."""

    def __init__(self, *sources):
        self.sources = sources

    def hint(self, task):
        return next((h for h in (s.hint(task) for s in self.sources) if h), None)

    def observe(self, episodes):
        return sorted({t for s in self.sources for t in s.observe(episodes)})

    def state_dict(self):
        return {str(j): s.state_dict() for j, s in enumerate(self.sources)}

    def load_state_dict(self, sd):
        for j, s in enumerate(self.sources):
            s.load_state_dict(sd[str(j)])


class Shortest(FirstOf):
    """The shortest of the sources' hints (mixed: an own win shorter than the expert's replaces it)."""

    def hint(self, task):
        hints = [h for h in (s.hint(task) for s in self.sources) if h]
        return min(hints, key=lambda h: len(h.actions)) if hints else None


def dropped_ids(tasks, share):
    """--drop_walkthroughs: a fixed share of the training tasks, drawn with one seed for every run (so every
    method and seed compares on the same tasks), treated as having no expert trajectory."""
    ids = sorted(t["id"] for t in tasks)
    return sorted(ids[i] for i in np.random.default_rng(2024).permutation(len(ids))[:round(share * len(ids))])


def expert(cfg, tasks):
    """The expert trajectories, less the tasks --drop_walkthroughs drops (none at 0)."""
    dropped = set(dropped_ids(tasks, cfg.drop_walkthroughs)) if cfg.drop_walkthroughs else set()
    return ExpertSource([t for t in tasks if t["id"] not in dropped])


class Dropped(ExpertSource):
    """--hint_source expert --drop_walkthroughs F: the expert's hints, less the dropped share."""

    def __init__(self, cfg, tasks):
        self.trajectories = expert(cfg, tasks).trajectories


class SelfHints(FirstOf):
    """--hint_source self: the expert's hint, and for a task without one the policy's own shortest win."""

    def __init__(self, cfg, tasks):
        super().__init__(expert(cfg, tasks), SelfSource())


class MixedHints(Shortest):
    """--hint_source mixed: each task's shorter of the expert's hint and the policy's own shortest win."""

    def __init__(self, cfg, tasks):
        super().__init__(expert(cfg, tasks), SelfSource())


REGISTRY = {"self": SelfHints, "mixed": MixedHints, "dropped": Dropped}
