"""[baseline] Players other than the paper's (rollout.Player): who plays a step's groups, chosen once at setup
(rollout.make_player through config.variant).

  ProbePlayer  the probe rules (--scheduler binary | enum, and --hybrid_probe): before the depths are fixed,
               the rule asks probe([(i, n)]) for the successes of R rollouts of batch task i from an n-step
               prefix; each rank plays the probes of its own tasks and the counts are shared, so every rank
               agrees. The group played at the chosen depth is the one trained on (not replayed); the other
               probes are the extra cost, logged apart (t_probe, probe_rollouts).
  SFTPlayer    --mode sft_full | sft_prefix: no policy play, the expert rows alone (sft_full: the whole hint;
               sft_prefix: the scheduler's n steps of it).
"""
import dataclasses

from rollout import Player, group, rollout


class ProbePlayer(Player):
    def prober(self, step, tasks, hints, mine):
        """The step's probe callback over the global batch (tasks, hints: this rank's shard, mine: their batch
        indices). Probe groups are kept so the chosen one is trained on."""
        self.tasks, self.hints, self.mine, self.step = tasks, hints, mine, step
        self.groups, self.stats, self.calls, self.seed = {}, {}, 0, self.cfg.seed + 97 * step + self.rank
        return self.probe

    def probe(self, pairs):  # [(batch index i, depth n)] -> successes, the same list on every rank
        local = [(self.mine.index(i), n) for i, n in pairs if i in self.mine]
        got = dict(zip([(self.mine[j], n) for j, n in local], self.play_probes(local)))
        for part in self.gather(got):
            got.update(part)
        return [got[p] for p in pairs]

    def play_probes(self, pairs):  # [(shard index j, n)] -> successes; each (j, n) is played once a step
        todo = [(j, n) for j, n in pairs if (j, n) not in self.groups]
        if todo:
            self.calls += 1
            out = rollout(self.engine, self.pool, self.tok,
                          [{**group(self.tasks[j], self.hints[j], n, self.cfg.group_size),
                            "key": ("probe", self.cfg.seed, self.step, self.mine[j], n)} for j, n in todo],
                          self.cfg, self.seed * 7919 + self.calls, self.reply)
            for k, v in out["stats"].items():
                self.stats[k] = self.stats.get(k, 0) + v
            for (j, n), g in zip(todo, split_groups(out, len(todo))):
                self.groups[(j, n)] = g
        return [sum(e["won"] for e in self.groups[(j, n)]["episodes"]) for j, n in pairs]

    def play(self, step, tasks, hints, n, pos):
        """Groups already played as the chosen probe are reused; the rest are played now, in one batch."""
        groups = [self.groups.get((j, nj)) for j, nj in enumerate(n)]
        todo = [j for j, g in enumerate(groups) if g is None]
        fresh = super().play(step, [tasks[j] for j in todo], [hints[j] for j in todo], [n[j] for j in todo],
                             [pos[j] for j in todo])
        for j, g in zip(todo, split_groups(fresh, len(todo))):
            groups[j] = g
        out = merge(groups)
        out["stats"] = fresh["stats"]
        return out


def split_groups(out, n_groups):
    """One rollout output per group (each with gid 0), in group order."""
    return [{k: [{**x, "gid": 0} for x in out[k] if x["gid"] == g] for k in ("rows", "aux", "episodes")}
            for g in range(n_groups)]


def merge(outs):
    """Concatenate rollout outputs, renumbering groups so they stay distinct; stats are summed."""
    merged = {"rows": [], "aux": [], "episodes": [], "stats": {}}
    offset = 0
    for o in outs:
        for k in ("rows", "aux", "episodes"):
            merged[k] += [{**x, "gid": x["gid"] + offset} for x in o[k]]
        for k, v in o.get("stats", {}).items():
            merged["stats"][k] = merged["stats"].get(k, 0) + v
        offset += 1 + max([x["gid"] for k in ("rows", "aux", "episodes") for x in o[k]], default=0)
    return merged


class SFTPlayer(Player):
    plays = False  # the policy plays no episode: the loss terms train on the expert rows alone

    def play(self, step, tasks, hints, n, pos=None):
        full = self.cfg.mode == "sft_full"
        depths = [(len(h.actions) if h else 0) if full else nj for h, nj in zip(hints, n)]
        out = rollout(self.engine, self.pool, self.tok,
                      [group(t, h, d, 1) for t, h, d in zip(tasks, hints, depths)],
                      dataclasses.replace(self.cfg, max_steps=0), self.cfg.seed + step, self.reply)
        out["episodes"] = []
        for r in out["aux"]:  # SFT fits the expert's text over the whole vocabulary (docs/method.md, "SFT")
            r.pop("allowed", None)
        return out


REGISTRY = {"probe": ProbePlayer, "sft": SFTPlayer}
