"""conftest.py — fixtures of the Python suites: the default model, the nstf
CLI of the same build (NSTF_CLI, set by CTest) and a tiny random model it
writes (nstf gen-model --shape tiny) for the loops that run a thousand
calls."""

import os
import subprocess

import pytest

ROOT = os.environ.get("NSTF_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def model_path():
    if not os.path.exists(MODEL):
        pytest.skip(f"no {MODEL}")
    return MODEL


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("NSTF_CLI") or os.path.join(ROOT, "build", "nstf")
    if not os.path.exists(path):
        pytest.skip(f"no nstf CLI at {path} (NSTF_CLI)")
    return path


@pytest.fixture(scope="session")
def tiny_model(cli, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("models") / "tiny.gguf")
    subprocess.run([cli, "gen-model", "--shape", "tiny", "--type", "q8_0", "-o", path], check=True,
                   capture_output=True)
    return path


@pytest.fixture(scope="module")
def model(model_path):
    import nstf

    m = nstf.Model(model_path, device="cpu", n_ctx=256, threads=2)
    yield m
    m.close()
