#!/bin/sh
# install_deps.sh — Debian packages the build needs.
#   install_deps.sh        the CPU build and tests (what `make deps` runs; with
#                          pytest and numpy for the Python suites, and the
#                          openai Python client for test_serve)
#   install_deps.sh torch  only torch and transformers from PyPI, for the
#                          suite of the PyTorch ops (test_python_torch, which
#                          is skipped without torch; large: a separate step)
#   install_deps.sh amd    also the AMD toolchains of `make amd`: Debian's hipcc
#                          (ROCm 5.2, clang 15) and clang-19; and, where nvcc is
#                          present, cuobjdump + nvdisasm from their PyPI wheels
#                          into build-amd/tools (SASS counts for `nstf isa`).
# libmicrohttpd-dev is the HTTP server of `nstf serve`; libedit-dev: line
# editing and history in `nstf chat`; liblapacke-dev: the SVD of the
# low-rank decomposition (src/opt/lowrank.c); libopenmpi-dev and
# openmpi-bin: launches by mpirun, one process per rank (libnstf_mpi,
# src/dist/mpi/shim.c; tests/test_mpi.c).
# clang + libclang-rt-dev are for `make fuzz`: libFuzzer's runtime
# (libclang_rt.fuzzer-x86_64.a) comes with libclang-rt-dev, which tracks the
# default clang (libclang-rt-14-dev for Debian 12's clang 14).
set -eu
want_amd=0
case "${1:-}" in
    "") ;;
    amd) want_amd=1 ;;
    torch)
        for m in torch transformers; do
            python3 -c "import $m" >/dev/null 2>&1 || python3 -m pip install -q "$m" ||
                echo "install_deps.sh: could not install $m; the suites that need it will be skipped" >&2
        done
        exit 0 ;;
    *) echo "install_deps.sh: unknown step '$1' (want nothing, 'torch' or 'amd')" >&2; exit 2 ;;
esac
need=""
pkgs="cmake make gcc pkg-config libpcre2-dev libcjson-dev libmicrohttpd-dev libedit-dev liblapacke-dev libopenmpi-dev openmpi-bin python3 python3-pip clang libclang-rt-dev"
[ $want_amd = 0 ] || pkgs="$pkgs hipcc clang-19"
for p in $pkgs; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
# A python with pip may come from elsewhere (pyenv); then python3-pip is not needed.
if command -v python3 >/dev/null 2>&1 && python3 -m pip --version >/dev/null 2>&1; then
    need=$(echo "$need" | sed 's/python3-pip//; s/ python3 / /')
fi
need=$(echo $need)
if [ -n "$need" ]; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $need
fi
# The official openai client, which test_serve drives `nstf serve` with
# (PyPI; the test skips without it). A system python that refuses pip
# installs (PEP 668) gets it in the user's site-packages.
if command -v python3 >/dev/null 2>&1 && ! python3 -c "import openai" >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check openai 2>/dev/null ||
        python3 -m pip install --quiet --disable-pip-version-check --user --break-system-packages openai ||
        echo "install_deps.sh: could not install the openai package; test_serve will be skipped" >&2
fi
# The Python suites (python/tests, run by make test): pytest and numpy, from
# PyPI for the python3 on PATH, or Debian's packages where pip may not
# install into it (an externally managed system Python).
py_need=""
for m in pytest numpy; do
    python3 -c "import $m" >/dev/null 2>&1 || py_need="$py_need $m"
done
if [ -n "$py_need" ] && ! python3 -m pip install -q $py_need; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    debs=""
    for m in $py_need; do debs="$debs python3-$m"; done
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $debs
fi
[ $want_amd = 1 ] || exit 0

# cuobjdump and nvdisasm for the sm_90a SASS counts: only useful with nvcc.
tools=${NSTF_ISA_TOOLS:-build-amd/tools}
if { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } &&
   ! command -v cuobjdump >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/cuobjdump ] &&
   [ ! -x "$tools/cuobjdump" ]; then
    tmp=$(mktemp -d)
    if python3 -m pip download -q --no-deps -d "$tmp" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm; then
        mkdir -p "$tools"
        python3 - "$tmp" "$tools" <<'PY'
import os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
for w in sorted(os.listdir(src)):
    with zipfile.ZipFile(os.path.join(src, w)) as z:
        for n in z.namelist():
            if n.endswith("/bin/cuobjdump") or n.endswith("/bin/nvdisasm"):
                out = os.path.join(dst, os.path.basename(n))
                with open(out, "wb") as f:
                    f.write(z.read(n))
                os.chmod(out, 0o755)
PY
    else
        echo "install_deps.sh: no cuobjdump wheel; nstf isa will count sm_90a instructions from PTX" >&2
    fi
    rm -rf "$tmp"
fi
