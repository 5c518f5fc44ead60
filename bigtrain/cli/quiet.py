"""What the libraries print that a bigtrain user can do nothing about, filtered at its source.

Each filter names the library's logger or warning (its module, category and message), never a global switch, so a
new warning from anywhere still shows. ``bigtrain -v`` keeps them all. Measured on a 2-rank DeepSpeed ZeRO-3 run of
recipes/deepspeed_zero3.yaml: 1,827 lines for 3 steps before these filters, the plan line, the progress bar and the
summary after (tests/integration/test_terminal.py).
"""

from __future__ import annotations

import logging
import warnings

# torch.distributed's deprecation wrapper warns on every call DeepSpeed makes (hundreds per step): the functions are
# DeepSpeed's choice, and torch 2.13 still runs them
_DEPRECATED_COLLECTIVES = r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated"


class _DropMessages(logging.Filter):
    """Drops the records of one logger whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # torchft's Manager puts its replica and step in brackets before each message
        message = message.split("] ", 1)[1] if message.startswith("[") and "] " in message else message
        return not message.startswith(self.prefixes)


def quiet_libraries() -> None:
    """Install the filters (in every process bigtrain starts: the launcher and each worker run it first)."""
    warnings.filterwarnings(
        "ignore", message=_DEPRECATED_COLLECTIVES, category=FutureWarning, module=r"torch\.distributed\.c10d_logger"
    )
    # peft asks a transformers model whether it checkpoints through a name transformers 5 deprecates (adapters
    # loaded for a merged export)
    warnings.filterwarnings(
        "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning, module=r"transformers"
    )
    # torchao registers its enums as pytree constants at import (transformers imports it to list its quantizers);
    # torch 2.13 logs a deprecation for each, twice per process
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    # torchao logs at import that its CUDA kernels cannot load on a machine without CUDA
    logging.getLogger("torchao").setLevel(logging.ERROR)
    # DeepSpeed says once per process that it chose its CPU accelerator, which is what a machine without GPUs wants
    logging.getLogger("DeepSpeed").addFilter(_DropMessages("Setting accelerator to CPU"))
    # MLflow logs each step of creating a new store's tables (train.log_to=mlflow); bigtrain says where the run is
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # mlflow sets its root logger at import
    # a replica group that heals reads the state torchft sent it from a read-only buffer (torch warns; it copies)
    warnings.filterwarnings(
        "ignore", message=r"The given buffer is not writable", category=UserWarning, module=r"torch\.distributed"
    )
    # torchft's Manager warns at every new quorum that it cannot reset NCCL's flight recorder (none on CPUs)
    logging.getLogger("torchft.manager").addFilter(_DropMessages("Unable to reset NCCL flight recorder"))
    _quiet_torchft_requests()
    # FSDP2 warns when the root module's output holds a view (a vision-language model's rope_deltas): bigtrain's
    # objectives read the outputs out of place, never writing into them
    warnings.filterwarnings(
        "ignore",
        message=r"FSDP2-wrapped module \(FSDP\w+ForConditionalGeneration\) returned a view tensor",
        category=UserWarning,
        module=r"torch\.distributed\.fsdp",
    )
    # ... and when a FLUX block returns its text and image halves as views of one tensor: the next block concatenates
    # them out of place, and the FSDP2 plans equal the plain loop (tests/distributed/test_text_to_image.py)
    warnings.filterwarnings(
        "ignore",
        message=r"FSDP2-wrapped module \(FSDPFlux\w+\) returned a view tensor",
        category=UserWarning,
        module=r"torch\.distributed\.fsdp",
    )
    # diffusers says at import that torchao's tensor classes do not import (torchao's CUDA kernels, absent on a CPU
    # machine): bigtrain loads no torchao-quantized diffusers checkpoint
    logging.getLogger("diffusers.quantizers.torchao.torchao_quantizer").setLevel(logging.ERROR)
    # DTensor warns on the global gradient norm under tp on a 2-D mesh (the norm's partial sums reduced over each mesh
    # dimension in turn): one small all-reduce per dimension per step, which bigtrain asks for on purpose
    logging.getLogger("torch.distributed.tensor._redistribute").addFilter(
        _DropMessages("While redistributing from (_NormPartial")
    )
    # matplotlib (bigtrain report) announces that it built its font cache on first use
    logging.getLogger("matplotlib.font_manager").setLevel(logging.WARNING)


def _quiet_torchft_requests() -> None:
    """torchft serves a healing replica group its state over HTTP, and http.server writes each request that
    succeeded (``"GET /checkpoint/5/full HTTP/1.1" 200``) to stderr, not to a logger: dropped for torchft's
    handlers only (their errors still show)."""
    from http.server import BaseHTTPRequestHandler

    original = BaseHTTPRequestHandler.log_request
    if getattr(original, "quiet_for_torchft", False):
        return

    def log_request(self: BaseHTTPRequestHandler, code: int | str = "-", size: int | str = "-") -> None:
        if not type(self).__module__.startswith("torchft."):
            original(self, code, size)

    log_request.quiet_for_torchft = True  # type: ignore[attr-defined]
    BaseHTTPRequestHandler.log_request = log_request  # type: ignore[method-assign]
