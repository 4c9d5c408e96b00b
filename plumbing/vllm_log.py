"""vLLM's log noise: the notices of vLLM 0.32's CPU build that ask nothing of a user of this repo, and the
filter that drops them (--vllm_log quiet, the default; rollout.make_engine calls quiet_vllm before vLLM's
first import).


Contract. quiet_vllm() before vLLM's first import: only the notices listed here are dropped; every warning
or error that asks something of the user still shows.
"""
import logging
import warnings


VLLM_NOISE = {  # logger -> starts of messages that ask nothing of a user of this repo (vLLM 0.32, CPU build)
    "vllm.engine.arg_utils": ("The global random seed is set",),  # we seed on purpose, in-process
    "vllm.config.vllm": ("Enforce eager set", "Inductor compilation was disabled",
                         "Model Runner V2 requires Triton"),
    "vllm.platforms.cpu": ("Triton is not installed", "Reset SSM cache type"),
    "vllm.triton_utils.importing": ("Triton is installed, but doesn't include CPU backend",),
    "vllm.v1.worker.cpu_worker": ("libtcmalloc is not found", "libiomp is not found",
                                  "CPU backend doesn't allow to use `torch.set_num_threads`"),
    # reload_weights, at every sync: the layerwise reloader counts the rotary embedding's cos/sin cache as a
    # loadable tensor, finds no checkpoint weight for it (no checkpoint has it) and puts the cache back
    # unchanged; the per-step sync check (sync_err in log.jsonl) shows the synced engine scores as the trainer
    "vllm.model_executor.model_loader.reload.layerwise": ("RotaryEmbedding: Failed to load weights",),
}


class DropNotices(logging.Filter):
    """A logging filter that drops records whose message starts with one of `starts`."""

    def __init__(self, starts):
        super().__init__()
        self.starts = tuple(starts)

    def filter(self, record):
        return not record.getMessage().startswith(self.starts)


def quiet_vllm():
    """--vllm_log quiet (the default): drop the notices of VLLM_NOISE and the FutureWarnings raised in vLLM's
    own frames (one raised with stacklevel >= 2 is attributed to its caller and still shows); every other
    warning passes. Filters sit on the named loggers themselves, because vLLM replaces its handlers
    (logging.config.dictConfig) when the engine is built. Idempotent. --vllm_log all: not called."""
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    for name, starts in VLLM_NOISE.items():
        lg = logging.getLogger(name)
        if not any(isinstance(f, DropNotices) and f.starts == starts for f in lg.filters):
            lg.addFilter(DropNotices(starts))
