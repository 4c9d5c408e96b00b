"""Run state as JSON: what the scheduler and the hint source save in every checkpoint (numpy arrays and
int-keyed dicts keep their types), and what train.py compares across ranks. numpy only.

Contract. encode_state(obj) -> JSON-able; decode_state gives back equal values with their types (numpy
arrays, int keys): a checkpointed rule resumes bit for bit.

    sd = encode_state(obj_state, "scheduler")   # JSON-able
    obj_state = decode_state(sd)
"""
import numpy as np


def encode_state(value, where):
    """A JSON-able copy of a state value: numpy arrays as {"__ndarray__": list, "dtype"}, int-keyed dicts as
    {"__int_keys__": [[k, v], ...]}, lists and str-keyed dicts recursively, numpy scalars as Python numbers;
    anything else (a tuple, a set, an object) raises rather than coming back as something else."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if value and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in value):
            return {"__int_keys__": [[int(k), encode_state(v, f"{where}[{k}]")] for k, v in value.items()]}
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where}: dict keys must be all str or all int to be saved, "
                            f"got {sorted(map(repr, value))[:3]}")
        return {k: encode_state(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [encode_state(v, f"{where}[{j}]") for j, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where}: a {type(value).__name__} cannot be saved in a checkpoint; keep state in "
                    "numpy arrays, lists, dicts and numbers")


def decode_state(value):
    """encode_state's inverse."""
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return np.array(value["__ndarray__"], dtype=value["dtype"])
        if "__int_keys__" in value:
            return {k: decode_state(v) for k, v in value["__int_keys__"]}
        return {k: decode_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_state(v) for v in value]
    return value


def attrs_state(obj, fixed, where):
    """Every attribute of obj but those named in `fixed`, encoded (a numpy Generator as its bit state): an
    object's whole state, so a new attribute is saved without a line of its own."""
    return encode_state({k: v.bit_generator.state if isinstance(v, np.random.Generator) else v
                         for k, v in vars(obj).items() if k not in fixed}, where)


def load_attrs(obj, sd):
    """attrs_state's inverse, in place (a Generator gets its bit state back)."""
    for k, v in decode_state(sd).items():
        if isinstance(getattr(obj, k, None), np.random.Generator):
            getattr(obj, k).bit_generator.state = v
        else:
            setattr(obj, k, v)
