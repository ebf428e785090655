"""run.py — the CTest entry of the Python suites (cmake/python.cmake):

    python3 python/tests/run.py python        the package over the C library
    python3 python/tests/run.py python_torch  the PyTorch ops on the CPU

Exits 77 (CTest's skip) when a precondition is missing: pytest or numpy
(scripts/install_deps.sh installs them), the package's library (build the
nstf_python target), the default model (make model), or for python_torch,
torch. Otherwise pytest's verdict: 0 when every test passed."""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def skip(why):
    print(f"run.py: skipped: {why}")
    sys.exit(77)


def main():
    suite = sys.argv[1] if len(sys.argv) > 1 else "python"
    if suite not in ("python", "python_torch"):
        print(f"run.py: unknown suite {suite!r} (python or python_torch)", file=sys.stderr)
        return 2
    for mod in ("pytest", "numpy"):
        if importlib.util.find_spec(mod) is None:
            skip(f"no {mod} module (scripts/install_deps.sh installs it)")
    if importlib.util.find_spec("nstf") is None:
        skip("the nstf package is not importable (PYTHONPATH=build/python)")
    model = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if suite == "python" and not os.path.exists(model):
        skip(f"no {model} (make model)")
    if suite == "python_torch" and importlib.util.find_spec("torch") is None:
        skip("no torch module")
    if suite == "python_torch" and os.environ.get("NSTF_PY_SANITIZED"):
        # torch throws C++ exceptions inside its dispatcher; with the ASan
        # runtime preloaded into an uninstrumented interpreter its __cxa_throw
        # interceptor aborts on them (a CHECK in libasan, not a report about
        # our code). The suite runs unsanitized in `make test`.
        skip("torch under a preloaded ASan runtime aborts on its own C++ exceptions")
    import pytest

    files = sorted(f for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py"))
    files = [os.path.join(HERE, f) for f in files if f.startswith("test_torch") == (suite == "python_torch")]
    if not files:
        print(f"run.py: no test files for {suite} in {HERE}", file=sys.stderr)
        return 1
    return pytest.main(["-q", "-p", "no:cacheprovider", "-rs", "--rootdir", HERE, *files])


if __name__ == "__main__":
    sys.exit(main())
