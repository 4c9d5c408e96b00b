"""The env pool: episodes live in worker processes (fresh interpreters, each building its engines with
envs.make_env); one call sends a turn's requests to every worker at once and gathers their results. A group's
R resets of one game replay the expert prefix once and fork (--fork_prefix: the engine's state lives in a C
library, so os.fork is the one way to copy it). A worker that dies is restarted; its episodes are lost, the
rest of the batch goes on. Every worker, and every episode it forks, ends when its parent does, however the
parent dies (die_with_parent); a worker holds at most MAX_LIVE live episodes.

Contract. EnvPool(num_workers, spec): run(requests) -> one answer per request, in order ("reset" with the
prefix to replay, "step" with an action, "close"); send / poll the same, without waiting (--overlap).
Promises: an episode's answers are what the environment itself gives (forking a replayed prefix changes none);
a worker's death loses its episodes alone (their answers say so); no worker outlives the process that made it.

    pool = EnvPool(num_workers, envs.env_spec(cfg))
    results = pool.run([("reset", eid, gamefile, prefix), ("step", eid, action), ("close", eid), ...])
    pool.send(requests); pool.poll(wait)   # --overlap: several sends in flight, answers as workers give them
"""
import atexit
import collections
import ctypes
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait as wait_any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root: `import envs` there
# episodes one worker holds at once: a forked one costs ~1.5 MB on the generated games, one in its own engine
# ~1.5 MB plus the engine's private 34 MB copy of libdownward in $TMPDIR (envs.py), so at most ~9 GB; a reset
# beyond it is answered with an error; train.py checks a step's share of a worker against it at setup
MAX_LIVE = 256
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)  # once: a forked episode arms its signal without a dlopen
except OSError:
    _LIBC = None


def die_with_parent(parent):
    """End this process when `parent` (its parent's pid) ends, however that dies (SIGKILL, the OOM killer):
    Linux's PR_SET_PDEATHSIG (prctl(2); it fires when the thread that started this process ends: EnvPool is
    made and restarts its workers from the trainer's main thread), elsewhere a thread that checks
    getppid()."""
    try:
        armed = _LIBC.prctl(1, signal.SIGKILL) == 0  # 1: PR_SET_PDEATHSIG
    except AttributeError:  # no prctl (macOS), no libc handle
        armed = False
    if not armed:
        def watch():
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)
        threading.Thread(target=watch, daemon=True).start()
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(1)


def _worker_main(fd, spec_json, make_env, parent):
    """A pool worker's entry (a fresh interpreter): make_env(spec) builds its engines (envs.make_env). At the
    end its exit handlers run, not the interpreter's teardown of the engines' modules (~0.3 s a worker)."""
    die_with_parent(parent)
    _worker(Connection(fd), json.loads(spec_json), make_env)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _step_result(env, ep, action):
    valid = env.step(ep, action)  # "done": a WebShop purchase ends the episode
    return {"ok": True, "valid": valid, "obs": ep["obs"], "admissible": ep["admissible"], "won": ep["won"],
            "score": ep.get("score", float(ep["won"])), "done": ep.get("done", ep["won"]),
            "milestone": ep.get("milestone", False)}  # BEACON's WebShop flag (plumbing/milestones.py)


def _error(e):
    return {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}


def _fork_episode(env, ep, close):
    """-> (pid, Connection) of a forked child that plays one episode on its copy of `env`, whose engine holds
    the replayed prefix (its state lives in a C library with get_state but no set_state: fork is the one way
    to copy it). `close`: the parent's connections, which the child must not hold open."""
    a, b = socket.socketpair()
    parent = os.getpid()
    pid = os.fork()
    if pid:
        b.close()
        return pid, Connection(a.detach())
    try:  # the child: one episode, then exit without running the parent's cleanup
        gc.disable()  # a short life: no collection passes that would copy every page of the parent's heap
        die_with_parent(parent)
        for c in (a, *close):
            c.close()
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


def _worker(conn, spec, make_env):
    """Holds engines (one per concurrent episode, reused) and the episodes' state. With spec["fork_prefix"],
    the R resets of a group (one game and prefix, one batch) replay the prefix once: the other R - 1 episodes
    are forked from the first right after its reset (_fork_episode). At most spec["max_live"] (MAX_LIVE)
    episodes live at once, forked or not."""
    envs, free, eps, kids = [], [], {}, {}  # eps: eid -> (env index, ep dict); kids: eid -> (pid, Connection)
    fork, max_live = spec.get("fork_prefix", False), spec.get("max_live", MAX_LIVE)

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
                    if len(eps) + len(kids) >= max_live:
                        raise RuntimeError(f"this worker holds {max_live} live episodes, its bound "
                                           "(plumbing/pool.py MAX_LIVE); episode lost")
                    key = (gamefile, tuple(prefix))
                    tpl = eps.get(first.get(key))  # forkable while still at the prefix's end (history)
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
    """`run(requests)` -> one result per request, in order (`send` then `recv`: the caller works meanwhile).
    Or several `send`s in flight and `poll`, which hands back each worker's answers as they come (a worker
    answers its messages in the order they came). Requests: ("reset", eid, gamefile, prefix), ("step", eid,
    action), ("close", eid). An episode lives on the worker its reset went to. A dead worker is restarted, its
    requests answered {"ok": False, "error": "worker crashed ..."}; the rest of the batch goes on. Create the
    pool before any CUDA initialisation."""

    def __init__(self, num_workers=2, spec=None):
        self.n, self.spec = max(1, num_workers), spec or {"env": "alfworld"}
        self.procs, self.conns = [None] * self.n, [None] * self.n
        self.restarts, self.home = 0, {}  # home: episode id -> worker
        self.queued = [collections.deque() for _ in range(self.n)]  # per worker: its unanswered messages
        for w in range(self.n):
            self._start(w)

    def _start(self, w):
        """A fresh interpreter per worker (not fork: safe after CUDA/vLLM init; not multiprocessing's spawn:
        that would re-run a top-level script such as train.py), talking over a socketpair Connection."""
        a, b = socket.socketpair()
        code = (f"import sys; sys.path.insert(0, {ROOT!r}); import envs; from plumbing import pool; "
                f"pool._worker_main({b.fileno()}, {json.dumps(self.spec)!r}, envs.make_env, {os.getpid()})")
        self.procs[w] = subprocess.Popen([sys.executable, "-c", code], pass_fds=[b.fileno()])
        b.close()
        self.conns[w] = Connection(a.detach())

    def run(self, requests):
        return self.recv(self.send(requests))

    def send(self, requests):  # -> a ticket for recv
        # a game's resets go to one worker (its translation cache and loaded engines serve the group), the
        # call's games round-robin; later requests follow their episode
        games = sorted({r[2] for r in requests if r[0] == "reset"})
        self.home.update({r[1]: games.index(r[2]) % self.n for r in requests if r[0] == "reset"})
        by_w = collections.defaultdict(list)
        for j, req in enumerate(requests):
            by_w[self.home.get(req[1], req[1] % self.n)].append(j)
        for w, js in by_w.items():
            part = [requests[j] for j in js]
            self.queued[w].append(part)
            try:
                self.conns[w].send(part)
            except (BrokenPipeError, OSError):
                pass  # noticed on recv
        return requests, by_w

    def recv(self, ticket):  # the ticket's answers, in its order (its messages must be the oldest unanswered)
        requests, by_w = ticket
        results = [None] * len(requests)
        for w, js in by_w.items():
            for j, r in zip(js, self._answer(w)[0][1]):
                results[j] = r
        for r in requests:
            if r[0] == "close":
                self.home.pop(r[1], None)
        return results

    def poll(self, wait=False):
        """[(request, result)] of the oldest message of each worker that has answered it; wait: block until
        one has (if any message is in flight)."""
        busy = [w for w in range(self.n) if self.queued[w]]
        ready = wait_any([self.conns[w] for w in busy], None if wait else 0) if busy else []
        return [(q, r) for w in busy if self.conns[w] in ready for part, got in self._answer(w)
                for q, r in zip(part, got)]

    def _answer(self, w):
        """Worker w's answer to its oldest message: [(message, results)]. A dead worker is restarted and
        every message it held answered with an error."""
        try:
            got = [(self.queued[w][0], self.conns[w].recv())]
            self.queued[w].popleft()
            return got
        except (EOFError, OSError, ConnectionResetError):
            try:
                code = self.procs[w].wait(5)
            except subprocess.TimeoutExpired:
                self.procs[w].kill()
                code = "killed"
        lost = {"ok": False, "error": f"worker crashed (exit code {code}); episode lost"}
        got = [(part, [lost] * len(part)) for part in self.queued[w]]
        self.queued[w].clear()
        self.restarts += 1
        self._start(w)
        return got

    def kill_worker(self, w):  # test hook
        self.procs[w].kill()
        self.procs[w].wait()

    def close(self):
        for w in range(self.n):  # every worker told first: they wind down together
            try:
                self.conns[w].send(None)
            except Exception:
                pass
        for w in range(self.n):
            try:
                self.procs[w].wait(2)
            except subprocess.TimeoutExpired:
                self.procs[w].kill()
