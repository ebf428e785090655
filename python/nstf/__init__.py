"""nstf — Python bindings of the NSTF engine (a C library, through ctypes).

    import nstf
    m = nstf.Model("models/SmolLM2-135M-Instruct.Q4_1.gguf", device="auto")
    print(m.generate("The capital of France is", n_predict=16, seed=1))
    for piece in m.stream("Tell me a story", chat=True):
        print(piece, end="", flush=True)
    ids = m.tokenize("Hello")            # int32 numpy array
    logits = m.logits(ids)               # float32 [n, n_vocab]

Failures of the library raise nstf.Error with its message. The PyTorch
custom ops (torch.ops.nstf.*) are registered by `import nstf.torch`, or at
`import nstf` when torch has already been imported."""

import sys

from ._lib import library_path
from .model import Error, Model

__version__ = "0.1.0"
__all__ = ["Error", "Model", "library_path", "gpu_runtime", "gpu_count", "__version__"]


def gpu_runtime():
    """"CUDA" or "HIP" when the loaded library has a GPU backend, else None."""
    from . import _lib

    r = _lib.load().nstf_gpu_runtime()
    return r.decode() if r else None


def gpu_count():
    """GPUs the library can see (0 without a GPU backend)."""
    from . import _lib

    return _lib.load().nstf_gpu_count()


if "torch" in sys.modules:  # registered now when torch is already imported
    from . import torch as _torch_ops  # noqa: F401
