"""Run train.py in this process under a profiler and write, as JSON, every function of the repository that runs
from the first evaluation to the end of the loop: in this process and in the env pool's workers
(tests/trace_hook). Units are top-level functions and the methods of top-level classes (a closure, a
comprehension or a lambda counts as the unit that holds it); a class whose methods ran adds its own lines (its
header, docstring and class attributes) once. train.py is counted whole, apart.
Used by tests/test_layout.py:  python tests/trace_step.py OUT_JSON train.py-args...
    -> {"train.py": lines, "units": {"file:name" or "file:Class.method" or "file:Class": lines}}"""
import ast
import glob
import json
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = {"tests", "runs", "results", "data", "checkpoints", "build", "docs"}


def repo_files():
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if not x.startswith(".") and x not in SKIP]
        out += [os.path.join(d, f) for f in files if f.endswith(".py")]
    return out


def units(path):
    """[(first line, last line, unit name)] of a module: its functions, its classes' methods, and per class
    the lines outside its methods (under the class's own name, first..last of the class)."""
    out = []
    first = lambda n: min([n.lineno] + [d.lineno for d in n.decorator_list])  # noqa: E731 (a code object's line)
    for n in ast.parse(open(path).read()).body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((first(n), n.end_lineno, n.name))
        elif isinstance(n, ast.ClassDef):
            methods = [m for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
            out += [(first(m), m.end_lineno, f"{n.name}.{m.name}") for m in methods]
            own = (n.end_lineno - first(n) + 1) - sum(m.end_lineno - first(m) + 1 for m in methods)
            out.append((first(n), n.end_lineno, n.name, own))
    return out


def unit_of(table, line):
    """The innermost unit holding a code object's first line -> (name, lines)."""
    hits = [u for u in table if u[0] <= line <= u[1]]
    if not hits:
        return None
    u = min(hits, key=lambda u: u[1] - u[0])
    return u[2], (u[3] if len(u) > 3 else u[1] - u[0] + 1)


def main():
    out_path, argv = sys.argv[1], sys.argv[2:]
    train = os.path.join(ROOT, "train.py")
    source = open(train).read()
    lines = source.splitlines()
    first = next(i + 1 for i, s in enumerate(lines) if s.startswith("if start_step == 0"))
    loop = next(n for n in ast.parse(source).body if isinstance(n, ast.For))
    tables = {p: units(p) for p in repo_files()}
    seen = set()

    def in_window(frame):
        while frame is not None:
            if frame.f_code.co_filename == train and frame.f_code.co_name == "<module>":
                return first <= frame.f_lineno <= loop.end_lineno
            frame = frame.f_back
        return False

    def profile(frame, event, arg):
        back = frame.f_back
        if back is None:
            return
        if back.f_code.co_name == "<module>" and back.f_code.co_filename == frame.f_code.co_filename:
            return  # a class body run by its module's import (a lazy import): no method of it ran
        if event == "call" and frame.f_code.co_filename in tables and in_window(back):
            seen.add((frame.f_code.co_filename, frame.f_code.co_firstlineno))

    os.environ.update(TRACE_WORKER_OUT=out_path + ".worker", TRACE_ROOT=ROOT,
                      PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests", "trace_hook"),
                                                  os.environ.get("PYTHONPATH", "")]))
    sys.argv = [train] + argv
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    sys.setprofile(profile)
    try:
        runpy.run_path(train, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    finally:
        sys.setprofile(None)
    for f in glob.glob(out_path + ".worker.*"):  # the workers exit when the pool closes, before train.py does
        seen |= {(p, line) for p, line in json.load(open(f)) if p in tables}
    found = {}
    for path, line in seen:
        if path == train:
            continue
        hit = unit_of(tables[path], line)
        if hit:
            rel = os.path.relpath(path, ROOT)
            found[f"{rel}:{hit[0]}"] = hit[1]
            if "." in hit[0]:  # a method: its class's own lines too
                cls = hit[0].split(".")[0]
                found[f"{rel}:{cls}"] = next(u[3] for u in tables[path] if u[2] == cls and len(u) > 3)
    json.dump({"train.py": len(lines), "units": found}, open(out_path, "w"), indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
