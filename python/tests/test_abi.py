"""test_abi.py — the ctypes side of the binding cannot drift from the
header: every struct of include/nstf.h that nstf/_lib.py mirrors has the
same fields, in the same order, with the matching ctypes types; every
function the package declares is exported by the library it loads; and the
GPU launchers the PyTorch ops call are declared with the prototypes of
src/ops/gpu/gpu_api.h (arity and C types; checked in every build, GPU or
not)."""

import ctypes
import os
import re

import nstf
from nstf import _lib as L

SOURCE = os.environ.get("NSTF_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
HEADER = os.path.join(SOURCE, "include", "nstf.h")
GPU_API = os.path.join(SOURCE, "src", "ops", "gpu", "gpu_api.h")

C_TYPES = {
    "float": ctypes.c_float, "double": ctypes.c_double, "int": ctypes.c_int, "bool": ctypes.c_bool,
    "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "const char *": ctypes.c_char_p, "char *": ctypes.c_char_p,
    "nstf_stop": ctypes.c_int,  # an enum
}

MIRRORS = {
    "nstf_sampler_params": L.SamplerParams,
    "nstf_session_params": L.SessionParams,
    "nstf_gen_stats": L.GenStats,
    "nstf_model_info": L.ModelInfo,
}


def header_structs(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = {}
    for m in re.finditer(r"typedef struct (\w+) \{(.*?)\} (\w+);", text, flags=re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            dm = re.match(r"((?:const )?\w+(?: \*)?)\s*(\*?)\s*(.*)", decl)
            ctype = dm.group(1) + (" *" if dm.group(2) else "")
            ctype = ctype.replace("  ", " ")
            for name in dm.group(3).split(","):
                name = name.strip()
                if name.startswith("*"):
                    ctype, name = ctype + " *", name[1:]
                fields.append((name, ctype))
        out[m.group(3)] = fields
    return out


def test_structs_match_header():
    with open(HEADER) as f:
        structs = header_structs(f.read())
    for cname, py in MIRRORS.items():
        assert cname in structs, f"{cname} not found in nstf.h"
        want = [(n, C_TYPES[t.replace("char*", "char *")]) for n, t in structs[cname]]
        got = [(n, t) for n, t in py._fields_]
        assert got == want, f"{cname}: nstf.h has {want}, _lib.py has {got}"


def test_declared_functions_exported():
    lib = nstf._lib.load()
    assert L.declare(lib, L._PUBLIC) == []


# C type of a gpu_api.h parameter or result -> the ctypes type that passes it
GPU_C_TYPES = {
    "nstf_status": ctypes.c_int, "int": ctypes.c_int, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_size_t, "float": ctypes.c_float, "nstf_type": ctypes.c_int, "nstf_gemm_epilogue": ctypes.c_int,
    "nstf_rope_mode": ctypes.c_int,  # enums pass as int
}


def gpu_prototypes():
    with open(GPU_API) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    out = {}
    for m in re.finditer(r"([A-Za-z_][\w ]*?[\w*])\s*\b(nstf_gpu_\w+)\s*\(([^;{]*?)\)\s*;", text):
        out[m.group(2)] = (m.group(1).strip(), [" ".join(a.split()) for a in m.group(3).split(",")])
    return out


def test_gpu_launchers_match_header():
    protos = gpu_prototypes()
    for name, (res, args) in L._GPU.items():
        assert name in protos, f"{name} is not in gpu_api.h"
        cres, cargs = protos[name]
        assert res is GPU_C_TYPES[cres], f"{name}: returns {cres}, _lib.py says {res}"
        assert len(args) == len(cargs), f"{name}: {len(cargs)} parameters in gpu_api.h, {len(args)} in _lib.py"
        for i, (c, py) in enumerate(zip(cargs, args)):
            if "*" in c:  # a pointer: a device buffer / stream as c_void_p, or the conv2d descriptor
                want = ctypes.POINTER(L.ConvDesc) if "nstf_conv2d_desc" in c else ctypes.c_void_p
            else:
                want = GPU_C_TYPES[c.rsplit(" ", 1)[0].replace("const ", "")]
            assert py is want, f"{name} parameter {i} ({c}): _lib.py declares {py.__name__}, wants {want.__name__}"
