"""The runtime environments behind one episode interface and their registry (the pool of worker processes
that plays them: plumbing/pool.py, re-exported here as envs.EnvPool).

Contract. make_env(spec) -> an env with reset(gamefile, prefix) -> the state after replaying the prefix (its
observation, admissible commands, history, the prefix's steps for the aux rows) and step(action) -> (obs,
admissible, won, done, valid, score). Promises: the real engine's observations (the parse caches change none:
tests/test_envs.py compares them with the uncached engine); a prefix action the engine refuses is an error.

    python envs.py stats [--games builtin|official|webshop-lite] [--env NAME]   # split sizes + expert lengths
    python envs.py webshop-doctor [--setting authors|human]         # what an official WebShop setup lacks
    python envs.py make-games ... | make-builtin                    # ALFWorld game generation (gamegen.py)

The registry: ENVS maps --env's names to their entries, `AlfEnv` (here) and `webshop.WebShopEnv`; `--env
module:Class` names a class of your own (README "Hack it"). env_class(name) is the one lookup: the pool's
workers (make_env), the run's worker spec (env_spec), the tasks of a split (plumbing/tasks.tasks_for), the
prompt's wording of the agent (rollout.user_message) and `envs.py stats` all go through it, so the pool, the
rollout loop, the scheduler and eval.py never branch on the environment. `Env` documents an entry and the
episode dict.

ALFWorld: the real engine (alfworld + TextWorld's PDDL engine) on generated or official games (gamegen.py
loads both). Engine facts this file works around (each in one small function):
- every PddlEnv dlopens its own 34 MB copy of libdownward and never frees it: envs are created once per
  worker and reused (`AlfEnv`);
- the engine's state lives inside that C library (it has get_state but no set_state), so a prefix
  shared by R rollouts cannot be cloned; instead the PDDL translation and the grammar's parse, which
  dominate reset, are cached (`_cache_pddl2sas`, `_cache_logic_parse`);
- fast_downward.pddl2sas overwrites sys.argv; the expert only recognises 'put' (`gamegen.patch_expert`).
"""
import argparse
import contextlib
import functools
import hashlib
import importlib.metadata
import os
import pickle
import re
import sys
import tempfile
import time
import zlib

from plumbing.plugins import plugin
from plumbing.gamegen import (BUILTIN, BUILTIN_TAR, HERE, INVALID_OBS, _alfworld_env, default_cache,
                              length_table, load_tasks, make_builtin, make_games, official_root, task_text)
from plumbing.pool import EnvPool  # noqa: F401  (re-exported: the worker pool that plays these envs)
from plumbing.webshop import WebShopEnv
from tools.webshop_doctor import webshop_doctor


# ---------------------------------------------------------------------------------------------
# An environment: one class, the registry's entry (class side) and the engine (instances) in one.
# ---------------------------------------------------------------------------------------------
class Env:
    """An environment: the class is its registry entry (the run's setup reads it), an instance is one
    engine in a pool worker (one per concurrent episode, reused across episodes). Subclass it for the
    defaults, or give the same names (webshop.WebShopEnv does).

    Class side:
      wording = (who, tip)          the full prompt: "You are {who}. ..."; tip: one more sentence after the
                                    reply instruction, or "" (rollout.user_message)
      env_spec(cfg) -> dict         what a worker needs to build an engine (JSON; "env": cfg.env)
      make_env(spec) -> engine      in the worker process (default: cls(spec))
      tasks(cfg, split, verbose) -> [{"id", "gamefile", "task_type", "goal", "walkthrough", "L"(, "thinks")}]:
                                    gamefile is what reset takes (a str or an int), walkthrough the expert's
                                    actions (the hints), L its length, task_type a row of the length table
      split_names(cfg) -> [name]    the splits tasks() knows (--train_split and --eval_split are checked
                                    against them at start-up), or None when only loading can tell
      stats(games) -> [(line or None, tasks)], one per split: `python envs.py stats` prints each line and
                                    its tasks' length table (default: tasks(None, split), split_names(None))
    Engine side (`gamefile`: the game loaded last, or None):
      reset(gamefile, prefix) -> the episode dict after replaying the prefix (RuntimeError on an action
                                 that is not admissible)
      step(ep, action) -> valid  takes any value: an inadmissible one (or a non-string) changes only obs and
                                 is recorded in the history (a non-string as "")
    The episode dict (tests/test_envs.py check_episode_interface checks it for every environment):
      obs: str                   the current observation
      admissible: [str]          the actions valid now
      won: bool                  the task is done (reward 1)
      history: [(obs, action)]   every step so far, prefix steps included, with the observation before it
      prefix_steps: [(obs, admissible, action)]   the replayed expert steps (the aux loss's prompts)
      task: str                  the task sentence
      room, room_short: str      the scene's description for the full / compact prompt (either may be "")
      score: float (optional)    the raw reward in [0, 1] (absent: float(won))
      done: bool (optional)      the episode has ended (absent: won); a WebShop purchase ends it
    Other keys (an engine's own state) may be there: the worker sends the whole dict back on reset."""
    wording = ("an agent in a text world", "")
    gamefile = None

    def __init__(self, spec=None):
        self.spec = spec

    @classmethod
    def make_env(cls, spec):
        return cls(spec)

    @staticmethod
    def env_spec(cfg):
        return {"env": cfg.env}

    @staticmethod
    def split_names(cfg):
        return None

    @classmethod
    def tasks(cls, cfg, split, verbose=False):
        raise NotImplementedError(f"{cls.__name__}.tasks(cfg, split, verbose): the tasks of a split")

    @classmethod
    def stats(cls, games=None):
        for split in cls.split_names(None) or []:
            tasks = cls.tasks(None, split)
            yield f"[envs] {cls.__name__} {split}: {len(tasks)} tasks", tasks


# ---------------------------------------------------------------------------------------------
# One engine object, reused across games and episodes.
# ---------------------------------------------------------------------------------------------
def _disk_memo(folder, version):
    """-> memo(args, compute): compute()'s value for args, kept in this process and on disk for every later
    worker and run: default_cache()/folder, made private (files are unpickled), one zlib'd pickle a key (a
    hash of the package's version and args, which must name every input but the package's own code).
    Writes are atomic (a temporary file, then a rename); a missing folder or a read-only disk keeps this
    process's copy only; an unreadable file is computed again and rewritten."""
    cache = {}

    def memo(args, compute):
        key = hashlib.sha256(repr((version, *args)).encode()).hexdigest()
        if key in cache:
            return cache[key]
        path = tmp = None
        with contextlib.suppress(Exception):  # no folder, or no readable file: computed below
            path = os.path.join(default_cache(), folder, key + ".pkl.z")
            with open(path, "rb") as f:
                cache[key] = pickle.loads(zlib.decompress(f.read()))
        if key not in cache:
            cache[key] = compute()
            try:  # (path None: no cache folder, so nothing is kept)
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    f.write(zlib.compress(pickle.dumps(cache[key]), 1))
                os.replace(tmp, path)  # atomic: a whole file or none
            except Exception:  # a read-only or full disk: no file left behind (tmp None: none was created)
                with contextlib.suppress(Exception):
                    os.remove(tmp)
        if len(cache) > 512:
            cache.pop(next(iter(cache)))
        return cache[key]
    return memo


def _cache_pddl2sas():
    """Reset translates the PDDL (twice) every time: a pure function of (domain, problem, optimize), kept
    by _disk_memo. An unpickled Task's conditions keep the writer's hashes: TextWorld reads its actions,
    types and objects, never compares them. Stops the translation clobbering sys.argv."""
    import fast_downward
    if getattr(fast_downward.pddl2sas, "_g2_cache", False):
        return
    orig = fast_downward.pddl2sas
    memo = _disk_memo("sas", importlib.metadata.version("fast_downward_textworld"))

    def translate(domain, problem, verbose, optimize):
        argv = list(sys.argv)
        out = orig(domain, problem, verbose=verbose, optimize=optimize)
        sys.argv[:] = argv
        return out

    def pddl2sas(domain, problem, verbose=False, optimize=False):
        return memo((optimize, domain, problem), lambda: translate(domain, problem, verbose, optimize))
    pddl2sas._g2_cache = True
    fast_downward.pddl2sas = pddl2sas
    import textworld.envs.pddl.logic as tw_logic
    tw_logic.fast_downward.pddl2sas = pddl2sas


def _cache_logic_parse():
    """Then most of a reset is tatsu parsing the game's own grammar (actions and text templates, one per
    game) into GameLogic: a pure function of the text, kept by _disk_memo. GameLogic copies the parsed
    actions and rules into containers of its own and nothing writes to them (a derivation deep-copies a
    rule's symbols), so every load of a game shares one parse."""
    import textworld.envs.pddl.logic as tw_logic
    if getattr(tw_logic._parse_and_convert, "_g2_cache", False):
        return
    orig, memo = tw_logic._parse_and_convert, _disk_memo("logic", importlib.metadata.version("textworld"))

    def parse(text, rule_name):
        return memo((rule_name, text), lambda: orig(text, rule_name=rule_name))
    parse._g2_cache = True
    tw_logic._parse_and_convert = parse  # looked up as a module global by GameLogic


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
    """Once the parse is cached, ~80 % of a step is deep-copying each derivation's context (copy_context in
    textworld/envs/pddl/textgen/__init__.py). `variables` and `mapping` hold shared objects that derivations
    only read (query() only adds keys): copying them one level deep gives the same text (a test compares)."""
    import textworld.envs.pddl.textgen as tg
    if getattr(tg.copy_context, "_g2_shallow", False):
        return

    def copy_context(context):
        return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
                "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}
    copy_context._g2_shallow = True
    tg.copy_context = copy_context  # looked up as a module global at every call


class AlfEnv(Env):
    """PddlEnv + AlfredDemangler + AlfredInfos, as alfworld's AlfredTWEnv builds it, without the gym layer.
    The class is ALFWorld's entry in ENVS (`--env alfworld`)."""
    wording = ("a household robot in a text world", "")

    @classmethod
    def make_env(cls, spec):
        return cls(spec.get("cache_translation", True))

    @staticmethod
    def env_spec(cfg):
        return {"env": cfg.env, "fork_prefix": cfg.fork_prefix}

    @staticmethod
    def split_names(cfg):
        """The built-in set's splits, or the official games' folders (None while $ALFWORLD_DATA lacks them:
        config.check_data says so)."""
        if cfg is None or cfg.games == "builtin":
            return list(BUILTIN)
        try:
            root = official_root()
        except FileNotFoundError:
            return None
        return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))

    @staticmethod
    def tasks(cfg, split, verbose=False):
        """The games of a split (gamegen.load_tasks), the training split's hints from --expert_data where it
        has an entry (plumbing/expert_data.py)."""
        task_types = cfg.task_types.split(",") if cfg.task_types else None
        tasks = load_tasks(split, cfg.games, cfg.cache_dir or None, task_types, verbose,
                           keep_unhinted=cfg.hint_source != "expert")
        if cfg.expert_data and split == cfg.train_split:
            from plumbing.expert_data import attach_expert_data, read_expert_file
            tasks, note = attach_expert_data(tasks, read_expert_file(cfg.expert_data), "alfworld")
            if verbose:
                print(note)
        return tasks

    @staticmethod
    def stats(games="builtin"):
        for split in BUILTIN:
            yield None, load_tasks(split, games, verbose=True)  # prints its own line

    def __init__(self, cache_translation=True, shallow_context=True):
        _alfworld_env()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs import PddlEnv
        if cache_translation:
            _cache_pddl2sas()
            _cache_logic_parse()
            _cache_textgen_parse()
            if shallow_context:  # False only for bench's before/after row (the patches are process-wide)
                _shallow_textgen_context()
        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        self.env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self.gamefile = None

    def reset(self, gamefile, prefix=()):
        """Load (unless loaded) + reset, then replay the expert prefix -> the episode dict (see Env)."""
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


def room_text(intro, short=False):
    """The intro without the banner and the task sentence (short: just the receptacle list)."""
    body = intro.split("=-", 2)[-1] if "-= Welcome" in intro else intro
    i = body.find("Your task is to:")
    body = (body[:i] if i >= 0 else body).strip()
    if short and "you see" in body:
        body = body.split("you see", 1)[1].strip().rstrip(".").replace(", and ", ", ").replace("a ", "")
    return body


# ---------------------------------------------------------------------------------------------
# The pool workers build their engines here (plumbing/pool.py runs them)
# ---------------------------------------------------------------------------------------------
def make_env(spec):
    """An engine in a pool worker: spec["env"]'s entry builds it from the spec (env_spec's dict)."""
    return env_class(spec["env"]).make_env(spec)



# ---------------------------------------------------------------------------------------------
# The registry: --env's names. WebShop's entry lives with WebShop's code (plumbing/webshop.py).
# ---------------------------------------------------------------------------------------------
ENVS = {"alfworld": AlfEnv, "webshop": WebShopEnv}


class EnvNames(list):
    """--env's choices (config.CHOICES["env"]): the registered names, which --help lists. Every string passes
    argparse's membership test, so that config.validate judges the name in one line (env_class): a name not
    registered is an error there, `module:Class` a class of your own."""

    def __contains__(self, name):
        return isinstance(name, str)


@functools.lru_cache(None)
def env_class(name):
    """--env's entry: a name in ENVS, or 'module:Class', a class of your own importable from sys.path (a file
    beside train.py, or on PYTHONPATH: the pool's workers import it too); else a one-line ValueError."""
    if name in ENVS:
        return ENVS[name]
    if not isinstance(name, str) or not re.fullmatch(r"[\w.]+:\w+", name):
        raise ValueError(f"--env {name!r}: no such environment; expected one of {list(ENVS)} or module:Class "
                         "(a class of your own, README \"Hack it\")")
    cls = plugin("env", name)  # its methods checked against an environment's interface (plumbing/plugins.py)
    if not hasattr(cls, "wording"):  # the one entry name that is not a method
        raise ValueError(f"--env {name}: {cls.__name__} lacks wording (subclass envs.Env)")
    return cls


def env_spec(cfg):
    """What a pool worker needs to build its environment, from the run config (the entry's env_spec)."""
    return env_class(cfg.env).env_spec(cfg)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("make-games", help="generate ALFWorld-format games offline")
    g.add_argument("--split", default="train", choices=list(BUILTIN))
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
    s.add_argument("--env", default="", help="a registered name or module:Class (default: from --games)")
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
            entry = env_class(a.env or ("webshop" if a.games == "webshop-lite" else "alfworld"))
            for line, tasks in entry.stats(a.games):  # the ALFWorld entry prints its own lines as it loads
                if line:
                    print(line)
                print(length_table(tasks))
        except (FileNotFoundError, ValueError) as e:  # one line, exit code 2, as train.py / eval.py
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)


if __name__ == "__main__":
    main()
