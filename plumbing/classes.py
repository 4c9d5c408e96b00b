"""'module:Class': a class of your own named on the command line (--scheduler, --hint_source, --loss_terms,
--env), imported from sys.path: a file beside train.py, or its folder on PYTHONPATH (the pool's workers
import it too). config.variant and envs.env_class both read such names through load_class."""
import importlib


def load_class(spec, where):
    """'module:Class' -> the class; a module that does not import or a missing class is a one-line ValueError
    starting with `where` (the flag and value it came from)."""
    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{where}: cannot import {module_name!r} ({e}); put its file beside train.py or its "
                         "folder on PYTHONPATH") from None
    except Exception as e:  # the file is there but does not run: a syntax error, an error at import
        where_in = f"{e.filename}, line {e.lineno}" if isinstance(e, SyntaxError) else type(e).__name__
        raise ValueError(f"{where}: {module_name!r} fails on import ({where_in}: "
                         f"{e.msg if isinstance(e, SyntaxError) else e})") from None
    if not hasattr(module, class_name):
        raise ValueError(f"{where}: no class {class_name!r} in {module.__file__}")
    return getattr(module, class_name)
