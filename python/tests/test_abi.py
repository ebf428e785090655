"""test_abi.py — the ctypes side of the binding cannot drift from the
header: every struct of include/nstf.h that nstf/_lib.py mirrors has the
same fields, in the same order, with the matching ctypes types; and every
function the package declares is exported by the library it loads."""

import ctypes
import os
import re

import nstf
from nstf import _lib as L

HEADER = os.path.join(os.environ.get("NSTF_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", ".."),
                      "include", "nstf.h")

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
