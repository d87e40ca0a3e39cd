"""The optimized implementation: what production runs (Triton kernels, builders, writers, routers).

Importing this package decides, once, how Triton kernels run here: with no GPU visible and no explicit
``TRITON_INTERPRET`` setting, the Triton interpreter is switched on *before* Triton is imported, so the same
kernels run on a laptop, in CI, on an NVIDIA GPU and on gfx942/gfx950. Interpreted, two costs of the interpreter
that change no result are removed (:mod:`impl.interpreter_fastpath`: re-patching inside a launch, frame-chunk
churn).
"""
from impl import runtime as _runtime

_runtime.configure_triton_mode()
if _runtime.triton_mode() == "interpreter":
    from impl import interpreter_fastpath as _fastpath

    _fastpath.install()
