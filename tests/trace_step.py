"""Run train.py in this process under a profiler and print, as JSON, every function of a top-level module that
ran while train.py's loop ran (closures, comprehensions and methods count as their top-level def or class).
Used by tests/test_layout.py: python tests/trace_step.py OUT_JSON train.py-args..."""
import ast
import json
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = {os.path.join(ROOT, f): f for f in os.listdir(ROOT) if f.endswith(".py")}


def top_level_defs(path):
    """[(first line, last line, name)] of the module's top-level functions and classes."""
    tree = ast.parse(open(path).read())
    return [(n.lineno, n.end_lineno, n.name) for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]


def main():
    out_path, argv = sys.argv[1], sys.argv[2:]
    train = os.path.join(ROOT, "train.py")
    loop = next(n for n in ast.parse(open(train).read()).body if isinstance(n, ast.For))
    defs = {path: top_level_defs(path) for path in TOP}
    seen = set()

    def in_loop(frame):
        while frame is not None:
            if frame.f_code.co_filename == train and frame.f_code.co_name == "<module>":
                return loop.lineno <= frame.f_lineno <= loop.end_lineno
            frame = frame.f_back
        return False

    def profile(frame, event, arg):
        if event != "call":
            return
        path = frame.f_code.co_filename
        if path not in TOP or not in_loop(frame.f_back):
            return
        line = frame.f_code.co_firstlineno
        name = next((n for a, b, n in defs[path] if a <= line <= b), None)
        if name is not None:
            seen.add(f"{TOP[path]}:{name}")

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
        json.dump(sorted(seen), open(out_path, "w"))


if __name__ == "__main__":
    main()
