"""The runtime environments behind one episode interface, and the pool of worker processes that plays them.

    python envs.py stats [--games builtin|official|webshop-lite]    # split sizes + expert lengths
    python envs.py webshop-doctor [--setting authors|human]         # what an official WebShop setup lacks
    python envs.py make-games ... | make-builtin                    # ALFWorld game generation (gamegen.py)

The episode interface: `env.reset(game, prefix) -> episode dict` (obs, admissible, won, history, prefix_steps,
task, room) and `env.step(ep, action) -> valid` (any string; an invalid one leaves the state unchanged).
`AlfEnv` (here) and `webshop.WebShopEnv` implement it, so the pool, the rollout loop, the scheduler and
eval.py never branch on the environment; `--env alfworld|webshop` picks one (make_env, env_spec, tasks_for).

ALFWorld: the real engine (alfworld + TextWorld's PDDL engine) on generated or official games (gamegen.py
loads both). Engine facts this file works around (each in one small function):
- every PddlEnv dlopens its own 34 MB copy of libdownward and never frees it: envs are created once per
  worker and reused (`AlfEnv`);
- the engine's state lives inside that C library (it has get_state but no set_state), so a prefix
  shared by R rollouts cannot be cloned; instead the PDDL translation, which dominates reset, is
  cached (`_cache_pddl2sas`);
- fast_downward.pddl2sas overwrites sys.argv; the expert only recognises 'put' (`gamegen.patch_expert`).
"""
import argparse
import collections
import functools
import gc
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection

from plumbing.gamegen import INVALID_OBS, _alfworld_env, make_builtin, make_games
from plumbing.tasks import BUILTIN, BUILTIN_TAR, HERE, length_table, load_tasks
from plumbing.webshop import WEBSHOP_SPLITS, WebShopEnv, scripted_expert, webshop_spec
from tools.webshop_doctor import webshop_doctor


# ---------------------------------------------------------------------------------------------
# One engine object, reused across games and episodes.
# ---------------------------------------------------------------------------------------------
def _cache_pddl2sas():
    """Reset re-translates the PDDL (twice) every time: ~90% of its cost. The translation is a pure function
    of (domain, problem, optimize), so cache it per process. Also stops it clobbering sys.argv."""
    import fast_downward
    if getattr(fast_downward.pddl2sas, "_g2_cache", False):
        return
    orig, cache = fast_downward.pddl2sas, {}

    def pddl2sas(domain, problem, verbose=False, optimize=False):
        key = (hash(domain), hash(problem), optimize)
        if key not in cache:
            argv = list(sys.argv)
            cache[key] = orig(domain, problem, verbose=verbose, optimize=optimize)
            sys.argv[:] = argv
            if len(cache) > 512:
                cache.pop(next(iter(cache)))
        return cache[key]
    pddl2sas._g2_cache = True
    fast_downward.pddl2sas = pddl2sas
    import textworld.envs.pddl.logic as tw_logic
    tw_logic.fast_downward.pddl2sas = pddl2sas


def _cache_textgen_parse():
    """TextWorld's grammar re-parses the same template strings with tatsu on every step (most of a
    step's cost). The parse is a pure function of the text; derive() mutates the symbols' context, so
    each use gets a copy."""
    import copy
    import textworld.envs.pddl.textgen as tg
    from textworld.logic import Rule
    if getattr(tg._parse_and_convert, "_g2_cache", False):
        return
    parse = functools.lru_cache(8192)(lambda text, rule_name, trace: tg.__dict__["_g2_orig"](
        text, rule_name=rule_name, trace=trace))
    tg._g2_orig = tg._parse_and_convert

    def cached(text, rule_name="symbols", trace=False):
        return copy.deepcopy(parse(text, rule_name, bool(trace)))
    cached._g2_cache = True
    tg._parse_and_convert = cached
    orig_q = Rule.parse_conjunctive_query.__func__
    Rule.parse_conjunctive_query = classmethod(functools.lru_cache(4096)(orig_q))  # returns an immutable Rule


def _shallow_textgen_context():
    """Once the parse is cached, ~80 % of a step is TextWorld's text generation deep-copying each derivation's
    context (textworld/envs/pddl/textgen/__init__.py, copy_context: `variables` and `mapping`, thousands of
    times a step). Their values are the shared EntityInfo objects and logic Variables that derivations only
    read; query() only adds keys to its copy. Copying the two dicts one level deep gives the same text (a test
    plays episodes with and without it and compares every observation)."""
    import textworld.envs.pddl.textgen as tg
    if getattr(tg.copy_context, "_g2_shallow", False):
        return

    def copy_context(context):
        return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
                "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}
    copy_context._g2_shallow = True
    tg.copy_context = copy_context  # looked up as a module global at every call


class AlfEnv:
    """PddlEnv + AlfredDemangler + AlfredInfos, as alfworld's AlfredTWEnv builds it, without the gym layer."""

    def __init__(self, cache_translation=True, shallow_context=True):
        _alfworld_env()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv
        if cache_translation:
            _cache_pddl2sas()
            _cache_textgen_parse()
            if shallow_context:  # False only for bench.py's before/after row (the patches are process-wide)
                _shallow_textgen_context()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        self.env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self.gamefile = None

    def reset(self, gamefile, prefix=()):
        """Load + reset, then execute the expert prefix in the engine. Returns the episode dict:
        obs, admissible, won, history [(obs before a, a)], prefix_steps [(obs, admissible, a)]."""
        if gamefile != self.gamefile:
            self.env.load(gamefile)
            self.gamefile = gamefile
        s = self.env.reset()
        ep = {"obs": s.feedback, "admissible": list(s["admissible_commands"]), "won": bool(s["won"]),
              "history": [], "prefix_steps": [], "task": task_text(s.feedback), "room": room_text(s.feedback),
              "room_short": room_text(s.feedback, short=True)}
        for a in prefix:
            if a not in ep["admissible"]:
                raise RuntimeError(f"expert prefix action {a!r} is not admissible in {gamefile}")
            ep["prefix_steps"].append((ep["obs"], ep["admissible"], a))
            self._step(ep, a)
        return ep

    def _step(self, ep, action):
        ep["history"].append((ep["obs"], action))
        s, _, _ = self.env.step(action)
        ep.update(obs=s.feedback, admissible=list(s["admissible_commands"]), won=bool(s["won"]))

    def step(self, ep, action):
        """Any string is accepted; an inadmissible one leaves the state unchanged ('Nothing happens.')."""
        valid = isinstance(action, str) and action in ep["admissible"]
        if valid:
            self._step(ep, action)
        else:
            ep["history"].append((ep["obs"], action if isinstance(action, str) else ""))
            ep["obs"] = INVALID_OBS
        return valid


def task_text(intro):
    """'Your task is to: put a hot apple in fridge.' -> 'put a hot apple in fridge.'"""
    i = intro.find("Your task is to:")
    return intro[i + len("Your task is to:"):].strip() if i >= 0 else ""


def room_text(intro, short=False):
    """The intro without the banner and the task sentence (short: just the receptacle list)."""
    body = intro.split("=-", 2)[-1] if "-= Welcome" in intro else intro
    i = body.find("Your task is to:")
    body = (body[:i] if i >= 0 else body).strip()
    if short and "you see" in body:
        body = body.split("you see", 1)[1].strip().rstrip(".").replace(", and ", ", ").replace("a ", "")
    return body


# ---------------------------------------------------------------------------------------------
# Env pool: episodes live in worker processes; requests for one turn go out together.
# ---------------------------------------------------------------------------------------------
def _worker_main(fd, spec_json):
    from multiprocessing.connection import Connection
    _worker(Connection(fd), json.loads(spec_json))


def make_env(spec):
    """spec: {"env": "alfworld", "cache_translation"} or
    {"env": "webshop", "backend", "seed", "products", ...}."""
    if spec["env"] == "alfworld":
        return AlfEnv(spec.get("cache_translation", True))
    if spec["env"] == "webshop":
        return WebShopEnv(spec)
    raise ValueError(f"unknown env {spec['env']!r} (alfworld | webshop)")


def _step_result(env, ep, action):
    valid = env.step(ep, action)
    return {"ok": True, "valid": valid, "obs": ep["obs"], "admissible": ep["admissible"], "won": ep["won"],
            "score": ep.get("score", float(ep["won"])),
            "done": ep.get("done", ep["won"])}  # WebShop: a purchase ends


def _error(e):
    return {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}


def _fork_episode(env, ep, close):
    """-> (pid, Connection) of a child process that plays one episode on its copy of `env`, whose engine
    already holds the replayed expert prefix: os.fork is the one way to copy the engine's state, which
    lives in a C library (get_state, no set_state). `close`: the parent's connections, which the child
    must not hold open."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid:
        b.close()
        return pid, Connection(a.detach())
    try:  # the child: one episode, then exit without running the parent's cleanup
        a.close()
        for c in close:
            c.close()
        gc.disable()  # a short life: no collection passes that would copy every page of the parent's heap
        kid = Connection(b.detach())
        while True:
            try:
                action = kid.recv()
            except EOFError:
                break
            if action is None:
                break
            try:
                kid.send(_step_result(env, ep, action))
            except Exception as e:
                kid.send(_error(e))
    finally:
        os._exit(0)


def _worker(conn, spec):
    """Holds engine objects (one per concurrent episode, reused) and the episodes' Python state. With
    spec["fork_prefix"], the R resets of a group (one game, one prefix, in one batch) replay the prefix once:
    the other R - 1 episodes are forked children of the first, right after its reset (_fork_episode)."""
    envs, free, eps = [], [], {}  # eps: episode id -> (env index, episode dict)
    kids = {}  # episode id -> (pid, Connection): forked episodes
    fork = spec.get("fork_prefix", False)

    def end_kid(eid):
        pid, c = kids.pop(eid)
        try:
            c.send(None)
        except OSError:
            pass
        c.close()
        os.waitpid(pid, 0)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            msg = None
        if msg is None:
            for eid in list(kids):
                end_kid(eid)
            return
        out = [None] * len(msg)
        sent = [j for j, req in enumerate(msg) if req[0] == "step" and req[1] in kids]
        for j in sent:  # forked episodes play their steps while this process plays its own
            try:
                kids[msg[j][1]][1].send(msg[j][2])
            except OSError:
                out[j] = {"ok": False, "error": "episode process lost; episode lost"}
        first = {}  # (gamefile, prefix) -> the episode of this batch that replayed it
        for j, req in enumerate(msg):
            if j in sent:
                continue
            try:
                if req[0] == "reset":
                    _, eid, gamefile, prefix = req
                    if eid in kids:
                        end_kid(eid)
                    if eid in eps:
                        free.append(eps.pop(eid)[0])
                    key = (gamefile, tuple(prefix))
                    # still at the prefix's end: nothing played after it (history)
                    tpl = eps.get(first.get(key))
                    if fork and prefix and tpl and len(tpl[1]["history"]) == len(prefix):
                        i, ep = tpl
                        kids[eid] = _fork_episode(envs[i], ep, [conn] + [c for _, c in kids.values()])
                        out[j] = {"ok": True, **ep}
                        continue
                    if not free:
                        envs.append(make_env(spec))
                        free.append(len(envs) - 1)
                    same = [k for k in free if envs[k].gamefile == gamefile]  # skip the load when possible
                    i = same[-1] if same else free[-1]
                    free.remove(i)
                    try:
                        ep = envs[i].reset(gamefile, prefix)
                    except Exception:
                        free.append(i)
                        raise
                    eps[eid], first[key] = (i, ep), eid
                    out[j] = {"ok": True, **ep}
                elif req[0] == "step":
                    _, eid, action = req
                    i, ep = eps[eid]
                    out[j] = _step_result(envs[i], ep, action)
                elif req[0] == "close":
                    if req[1] in kids:
                        end_kid(req[1])
                    elif req[1] in eps:  # the engine keeps its game loaded for the next episode of it
                        free.append(eps.pop(req[1])[0])
                    out[j] = {"ok": True}
                elif req[0] == "crash":  # test hook: die like a segfaulting engine would
                    os._exit(3)
                else:
                    raise ValueError(f"unknown request {req[0]!r}")
            except Exception as e:
                out[j] = _error(e)
        for j in sent:
            if out[j] is None:
                try:
                    out[j] = kids[msg[j][1]][1].recv()
                except (EOFError, OSError):
                    out[j] = {"ok": False, "error": "episode process died; episode lost"}
        conn.send(out)


class EnvPool:
    """`run(requests)` -> one result per request, in order. Requests: ("reset", eid, gamefile, prefix),
    ("step", eid, action), ("close", eid). An episode lives on the worker its reset went to. A worker that
    dies is restarted; its requests come back as {"ok": False, "error": "worker crashed ..."} and the rest of
    the batch is unaffected. Create the pool before any CUDA initialisation."""

    def __init__(self, num_workers=2, spec=None):
        self.n, self.spec = max(1, num_workers), spec or {"env": "alfworld"}
        self.procs, self.conns = [None] * self.n, [None] * self.n
        self.restarts, self.home = 0, {}  # home: episode id -> worker
        for w in range(self.n):
            self._start(w)

    def _start(self, w):
        """A fresh interpreter per worker (not fork: safe after CUDA/vLLM init; not multiprocessing's spawn:
        that would re-run a top-level script such as train.py), talking over a socketpair Connection."""
        a, b = socket.socketpair()
        code = (f"import sys; sys.path.insert(0, {HERE!r}); import envs; "
                f"envs._worker_main({b.fileno()}, {json.dumps(self.spec)!r})")
        self.procs[w] = subprocess.Popen([sys.executable, "-c", code], pass_fds=[b.fileno()])
        b.close()
        self.conns[w] = Connection(a.detach())

    def run(self, requests):
        # resets of one game go to one worker (its translation cache and loaded engines serve the whole
        # group); distinct games of the call are spread round-robin; later requests follow their episode
        games = sorted({r[2] for r in requests if r[0] == "reset"})
        for r in requests:
            if r[0] == "reset":
                self.home[r[1]] = games.index(r[2]) % self.n
        by_w = collections.defaultdict(list)
        for j, req in enumerate(requests):
            by_w[self.home.get(req[1], req[1] % self.n)].append(j)
        for w, js in by_w.items():
            try:
                self.conns[w].send([requests[j] for j in js])
            except (BrokenPipeError, OSError):
                pass  # noticed on recv
        results = [None] * len(requests)
        for w, js in by_w.items():
            try:
                got = self.conns[w].recv()
            except (EOFError, OSError, ConnectionResetError):
                try:
                    code = self.procs[w].wait(5)
                except subprocess.TimeoutExpired:
                    self.procs[w].kill()
                    code = "killed"
                got = [{"ok": False, "error": f"worker crashed (exit code {code}); episode lost"}] * len(js)
                self.restarts += 1
                self._start(w)
            for j, r in zip(js, got):
                results[j] = r
        for r in requests:
            if r[0] == "close":
                self.home.pop(r[1], None)
        return results

    def kill_worker(self, w):  # test hook
        self.procs[w].kill()
        self.procs[w].wait()

    def close(self):
        for w in range(self.n):
            try:
                self.conns[w].send(None)
            except Exception:
                pass
            try:
                self.procs[w].wait(2)
            except subprocess.TimeoutExpired:
                self.procs[w].kill()


def env_spec(cfg):
    """What a pool worker needs to build its environment, from the run config."""
    if cfg.env == "webshop":  # split: paper | authors (webshop.webshop_split_indices)
        return webshop_spec(cfg)
    return {"env": "alfworld", "fork_prefix": cfg.fork_prefix}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("make-games", help="generate ALFWorld-format games offline")
    g.add_argument("--split", default="train", choices=["train", "valid_seen", "valid_unseen"])
    g.add_argument("--n", type=int, default=200)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", required=True)
    g.add_argument("--workers", type=int, default=2)
    g.add_argument("--max_len", type=int, default=15, help="re-sample games whose walkthrough is longer")
    g.add_argument("--min_receptacles", type=int, default=6)
    g.add_argument("--max_receptacles", type=int, default=12)
    sub.add_parser("make-builtin", help=f"rebuild {os.path.relpath(BUILTIN_TAR, HERE)} ({BUILTIN})")
    s = sub.add_parser("stats", help="split sizes and expert-length distributions")
    s.add_argument("--games", default="builtin", choices=["builtin", "official", "webshop-lite"])
    d = sub.add_parser("webshop-doctor",
                       help="check an official WebShop setup ($WEBSHOP_PATH): what each setting lacks")
    d.add_argument("--setting", default="both", choices=["authors", "human", "both"],
                   help="authors: their 1,000-product files, synthetic goals; "
                        "human: the full set, human goals")
    a = ap.parse_args()
    if a.cmd == "make-games":
        t0 = time.time()
        res = make_games(a.out, a.split, a.n, a.seed, a.workers, a.max_len, a.min_receptacles,
                         a.max_receptacles)
        print(f"{len(res)} games in {time.time() - t0:.0f}s, {sum(r[3] for r in res)} draws re-sampled")
        print(length_table([{"task_type": tt, "L": L} for _, L, tt, _ in res]))
    elif a.cmd == "make-builtin":
        make_builtin()
    elif a.cmd == "webshop-doctor":
        ok_all = True
        for setting in (["authors", "human"] if a.setting == "both" else [a.setting]):
            checks = webshop_doctor(setting=setting)
            ok_all &= all(ok for ok, _, _ in checks)
            print(f"--- setting {setting} ({'ready' if all(ok for ok, _, _ in checks) else 'incomplete'})")
            for ok, what, fix in checks:
                print(f"[{'ok' if ok else 'MISSING'}] {what}" + (f"\n          fix: {fix}" if fix else ""))
        sys.exit(0 if ok_all else 1)
    else:
        try:
            if a.games == "webshop-lite":  # every goal of every split through the scripted expert
                env = WebShopEnv({"env": "webshop", "backend": "lite", "seed": 0, "products": 1000,
                                  "max_steps": 99})
                for split, (lo, hi) in WEBSHOP_SPLITS.items():
                    idx = range(lo, min(hi or len(env.goals), len(env.goals)))
                    res = [scripted_expert(env, i) for i in idx]
                    print(f"[envs] webshop-lite {split}: {len(idx)} goals, scripted expert reward 1 on "
                          f"{sum(s == 1.0 for _, s in res)}")
                    print(length_table([{"task_type": env.goals[i]["category"], "L": len(w)}
                                        for i, (w, _) in zip(idx, res)]))
                return
            for split in ("train", "valid_seen", "valid_unseen"):
                print(length_table(load_tasks(split, a.games, verbose=True)))
        except FileNotFoundError as e:  # one line, exit code 2, as train.py / eval.py
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    main()
