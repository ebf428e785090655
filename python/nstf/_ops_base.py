"""_ops_base.py — what the PyTorch ops of nstf.torch share: the library's
GPU launchers on torch's current stream, tensor pointers and alignment,
argument checks, and the dtype rules (bf16 on a GPU; the reference path
keeps float32 / float64 in their own precision)."""

import ctypes
import threading

import torch

from . import _lib as L
from .model import Error, _check


_tls = threading.local()
_BF16 = torch.bfloat16


def available():
    """Whether the loaded library runs the ops on GPU tensors."""
    return L.gpu() is not None


def _gpu():
    lib = L.gpu()
    if lib is None:
        raise Error("this nstf library has no GPU backend: build it with NSTF_CUDA=ON (or NSTF_HIP=ON) to run the "
                    "ops on GPU tensors", 4, "unsupported")
    return lib


def _launch(t):
    """(lib, stream) for a launch on t's device: that device made current in
    the library's runtime, torch's current stream of it."""
    lib = _gpu()
    dev = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if getattr(_tls, "dev", None) != dev:
        _check(lib, lib.nstf_gpu_set_device(dev))
        _tls.dev = dev
    return lib, ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)


def _p(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _dense(t, align=16):
    """t contiguous, its data aligned to `align` bytes (a copy when not)."""
    t = t.contiguous()
    if t.data_ptr() % align:
        t = t.clone()
    return t


def _need(cond, msg):
    if not cond:
        raise ValueError("nstf: " + msg)


def _out_dtype(x, f32=False):
    """bf16 inputs give bf16 (fp32 with f32); the reference path keeps
    float32 / float64 inputs in their own precision."""
    if x.dtype == _BF16:
        return torch.float32 if f32 else _BF16
    return x.dtype


def _ref_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _cuda_bf16(name, *ts):
    for t in ts:
        if t is not None:
            _need(t.dtype == _BF16, f"{name} on a GPU takes bf16 tensors, got {t.dtype}")
