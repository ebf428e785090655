"""_lib.py — the C library through ctypes: finding and loading libnstf.so,
the structs of include/nstf.h as ctypes Structures (tests/test_abi.py
checks them against the header field by field), and the prototypes of the
functions the package calls.

The library is loaded with ctypes.CDLL, so the GIL is released for the
whole of every foreign call (generation, evaluation, a kernel launch): other
Python threads run while the engine works. Callbacks from C (the piece
callback of generation) take the GIL back for the duration of the callback
only. (CFFI in ABI mode does the same; ctypes was chosen because it ships
with Python.)

Which file is loaded: $NSTF_LIBRARY when set, else libnstf.so next to this
file (the wheel, or a build tree's python/nstf directory)."""

import ctypes
import os

c_int = ctypes.c_int
c_int32 = ctypes.c_int32
c_int64 = ctypes.c_int64
c_uint64 = ctypes.c_uint64
c_float = ctypes.c_float
c_double = ctypes.c_double
c_bool = ctypes.c_bool
c_char_p = ctypes.c_char_p
c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p


class SamplerParams(ctypes.Structure):
    """nstf_sampler_params"""
    _fields_ = [
        ("temp", c_float),
        ("top_k", c_int),
        ("top_p", c_float),
        ("min_p", c_float),
        ("repeat_penalty", c_float),
        ("repeat_last_n", c_int),
        ("seed", c_uint64),
    ]


class SessionParams(ctypes.Structure):
    """nstf_session_params"""
    _fields_ = [
        ("n_ctx", c_int),
        ("n_batch", c_int),
        ("n_threads", c_int),
        ("device", c_char_p),
        ("verbose", c_bool),
        ("precise", c_bool),
        ("deterministic", c_bool),
        ("cpu_act_bits", c_int),
        ("chat_template", c_char_p),
        ("n_gpu_layers", c_int),
        ("sparse_attn", c_int),
        ("sparse_topk", c_int),
        ("sparse_window", c_int),
        ("sparse_block", c_int),
        ("n_tp", c_int),
        ("gpus", c_char_p),
        ("tp_timeout_ms", c_int),
        ("cache_type_k", c_char_p),
        ("cache_type_v", c_char_p),
    ]


class GenStats(ctypes.Structure):
    """nstf_gen_stats"""
    _fields_ = [
        ("n_prompt", c_int64),
        ("n_gen", c_int64),
        ("n_decode", c_int64),
        ("prompt_ms", c_double),
        ("gen_ms", c_double),
        ("load_ms", c_double),
        ("stop", c_int),
        ("n_shifts", c_int64),
        ("n_past", c_int64),
    ]


class ModelInfo(ctypes.Structure):
    """nstf_model_info"""
    _fields_ = [
        ("n_vocab", c_int),
        ("n_ctx", c_int),
        ("n_ctx_train", c_int),
        ("n_layers", c_int),
        ("dim", c_int),
        ("n_heads", c_int),
        ("n_kv_heads", c_int),
        ("head_dim", c_int),
        ("ffn_dim", c_int),
        ("bos", c_int32),
        ("eos", c_int32),
        ("add_bos", c_bool),
        ("backend", c_char_p),
        ("device", c_char_p),
        ("n_batch", c_int),
    ]


# bool (*nstf_piece_fn)(void *user, int32_t token, const char *piece, size_t len)
# (piece as a void pointer: it is not NUL-terminated; ctypes.string_at reads len bytes)
PieceFn = ctypes.CFUNCTYPE(c_bool, c_void_p, c_int32, c_void_p, c_size_t)

# name: (restype, argtypes) of the public API (include/nstf.h) the package uses
_PUBLIC = {
    "nstf_last_error": (c_char_p, []),
    "nstf_status_str": (c_char_p, [c_int]),
    "nstf_sampler_default_params": (SamplerParams, []),
    "nstf_session_default_params": (SessionParams, []),
    "nstf_session_open": (c_int, [c_char_p, ctypes.POINTER(SessionParams), ctypes.POINTER(c_void_p)]),
    "nstf_session_close": (None, [c_void_p]),
    "nstf_session_generate": (c_int, [c_void_p, c_char_p, c_bool, c_char_p, ctypes.POINTER(SamplerParams), c_int,
                                      c_bool, PieceFn, c_void_p, ctypes.POINTER(GenStats)]),
    "nstf_time_seed": (c_uint64, []),
    "nstf_session_info": (c_int, [c_void_p, ctypes.POINTER(ModelInfo)]),
    "nstf_session_tokenize": (c_int, [c_void_p, c_char_p, c_size_t, c_int, c_bool, ctypes.POINTER(c_int32), c_int64,
                                      ctypes.POINTER(c_int64)]),
    "nstf_session_detokenize": (c_int, [c_void_p, ctypes.POINTER(c_int32), c_int64, ctypes.c_char_p, c_size_t,
                                        ctypes.POINTER(c_size_t)]),
    "nstf_session_eval": (c_int, [c_void_p, ctypes.POINTER(c_int32), c_int64, c_bool, ctypes.POINTER(c_float)]),
    # nstf_tools.h: which GPU runtime the build has (NULL: none) and the device count
    "nstf_gpu_runtime": (c_char_p, []),
    "nstf_gpu_count": (c_int, []),
}


class ConvDesc(ctypes.Structure):
    """nstf_conv2d_desc (include/nstf_tools.h)"""
    _fields_ = [
        ("n", c_int64), ("c", c_int64), ("h", c_int64), ("w", c_int64),
        ("k", c_int64), ("r", c_int64), ("s", c_int64),
        ("stride_h", c_int), ("stride_w", c_int), ("pad_h", c_int), ("pad_w", c_int),
        ("dil_h", c_int), ("dil_w", c_int), ("groups", c_int), ("layout", c_int),
    ]


# The library's internal interface that the PyTorch ops use (in every build):
# conv2d descriptors and their fp64 reference (include/nstf_tools.h,
# src/ops/conv.h), and the block (de)quantization of core/dtype.h. Not a
# stable API: it moves with the library the package ships with.
_TOOLS = {
    "nstf_conv2d_out_size": (c_int, [ctypes.POINTER(ConvDesc), ctypes.POINTER(c_int64), ctypes.POINTER(c_int64)]),
    "nstf_ref_conv2d": (c_int, [ctypes.POINTER(ConvDesc), c_void_p, c_void_p, c_void_p, c_void_p]),
    "nstf_quantize_row": (None, [c_int, c_void_p, c_void_p, c_int64]),
    "nstf_dequantize_row": (None, [c_int, c_void_p, c_void_p, c_int64]),
    "nstf_type_row_bytes": (c_bool, [c_int, c_int64, ctypes.POINTER(c_uint64)]),
}

# The GPU launchers of src/ops/gpu/gpu_api.h (in a GPU build only). Every
# pointer is device memory; `stream` is a cudaStream_t / hipStream_t.
_GPU = {
    "nstf_gpu_set_device": (c_int, [c_int]),
    "nstf_gpu_get_rows": (c_int, [c_int, c_void_p, c_int64, c_void_p, c_void_p, c_int, c_int64, c_int64, c_void_p]),
    "nstf_gpu_gemm_bf16": (c_int, [c_void_p, c_void_p, c_void_p, c_int, c_void_p, c_int, c_int64, c_int64, c_int64,
                                   c_int, c_void_p]),
    "nstf_gpu_gemv": (c_int, [c_int, c_void_p, c_void_p, c_void_p, c_int, c_int64, c_int64, c_int64, c_void_p]),
    "nstf_gpu_flash_attn": (c_int, [c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_void_p,
                                    c_void_p, c_int64, c_int64, c_int64, c_int64, c_int, c_int, c_int, c_float,
                                    c_void_p]),
    "nstf_gpu_flash_decode_scratch_bytes": (c_size_t, [c_int64, c_int64, c_int, c_int, c_int]),
    "nstf_gpu_flash_decode": (c_int, [c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_void_p,
                                      c_void_p, c_int64, c_int64, c_int64, c_int64, c_int, c_int, c_int, c_float,
                                      c_void_p, c_size_t, c_void_p]),
    # training: the forward that saves the log-sum-exp, the backward from it
    "nstf_gpu_flash_attn_lse": (c_int, [c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_void_p,
                                        c_void_p, c_int64, c_void_p, c_int64, c_int64, c_int64, c_int, c_int, c_int,
                                        c_float, c_void_p]),
    "nstf_gpu_flash_attn_bwd_scratch_bytes": (c_size_t, [c_int64, c_int]),
    "nstf_gpu_flash_attn_bwd": (c_int, [c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_int64,
                                        c_void_p, c_int64, c_void_p, c_void_p, c_int64, c_void_p, c_int64, c_void_p,
                                        c_int64, c_int64, c_int64, c_int, c_int, c_int, c_float, c_void_p, c_size_t,
                                        c_void_p]),
    "nstf_gpu_rmsnorm": (c_int, [c_void_p, c_void_p, c_int, c_void_p, c_void_p, c_int64, c_int64, c_float, c_void_p]),
    "nstf_gpu_rope_strided": (c_int, [c_void_p, c_int64, c_void_p, c_int64, c_void_p, c_int64, c_int, c_int, c_int,
                                      c_float, c_void_p, c_int, c_void_p]),
    "nstf_gpu_swiglu": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_void_p]),
    "nstf_gpu_swiglu_rows": (c_int, [c_void_p, c_void_p, c_int64, c_int64, c_void_p]),
    "nstf_gpu_swiglu_packed_row": (c_int64, [c_int64, c_int64]),
    "nstf_gpu_conv2d": (c_int, [ctypes.POINTER(ConvDesc), c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_int,
                                c_void_p]),
    "nstf_gpu_conv2d_supported": (c_int, [ctypes.POINTER(ConvDesc), c_int]),
}

# nstf_type ids (core/dtype.h: GGUF's)
TYPE_F32, TYPE_F16, TYPE_Q4_0, TYPE_Q4_1, TYPE_Q8_0, TYPE_BF16 = 0, 1, 2, 3, 8, 30

_lib = None
_gpu_lib = None


def library_path():
    """The file load() opens."""
    env = os.environ.get("NSTF_LIBRARY")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libnstf.so")


def declare(lib, table):
    """Set restype/argtypes of every function of `table` found in lib;
    returns the names that are missing."""
    missing = []
    for name, (res, args) in table.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        f.restype = res
        f.argtypes = args
    return missing


def load():
    """The loaded library (once per process)."""
    global _lib
    if _lib is None:
        path = library_path()
        if not os.path.exists(path):
            raise OSError(
                f"nstf: the C library is not at {path}: install the package (pip install ./python), put a "
                f"build tree's python/ directory on PYTHONPATH (cmake builds it), or set NSTF_LIBRARY")
        lib = ctypes.CDLL(path)
        missing = declare(lib, _PUBLIC) + declare(lib, _TOOLS)
        if missing:
            raise OSError(f"nstf: {path} lacks {', '.join(missing)}: it is older than this package")
        _lib = lib
    return _lib


def gpu():
    """The library with its GPU launchers declared, or None when the build
    has no GPU backend."""
    global _gpu_lib
    lib = load()
    if _gpu_lib is None:
        if not lib.nstf_gpu_runtime():
            return None
        missing = declare(lib, _GPU)
        if missing:
            raise OSError(f"nstf: {library_path()} has a GPU backend but lacks {', '.join(missing)}")
        _gpu_lib = lib
    return _gpu_lib
