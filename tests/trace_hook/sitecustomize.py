"""Loaded by every Python process started with tests/trace_hook on PYTHONPATH and TRACE_WORKER_OUT set (the
env pool's workers under tests/trace_step.py): records each function of the repository that runs while the
worker serves requests (under plumbing/pool.py:_worker), and writes them, as (file, first line), at exit."""
import atexit
import json
import os
import sys

OUT, ROOT = os.environ.get("TRACE_WORKER_OUT"), os.environ.get("TRACE_ROOT")
if OUT and ROOT:
    seen = set()

    def serving(frame):
        while frame is not None:
            if frame.f_code.co_name == "_worker" and frame.f_code.co_filename.endswith("pool.py"):
                return True
            frame = frame.f_back
        return False

    def profile(frame, event, arg):
        path, back = frame.f_code.co_filename, frame.f_back
        if back is not None and back.f_code.co_name == "<module>" and back.f_code.co_filename == path:
            return  # a class body run by its module's import
        if event == "call" and path.startswith(ROOT) and serving(frame):
            seen.add((path, frame.f_code.co_firstlineno))

    sys.setprofile(profile)
    atexit.register(lambda: json.dump(sorted(seen), open(f"{OUT}.{os.getpid()}", "w")))
