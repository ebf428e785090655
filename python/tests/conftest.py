"""conftest.py — fixtures of the Python suites: the default model, the nstf
CLI of the same build (NSTF_CLI, set by CTest) and a tiny random model it
writes (nstf gen-model --shape tiny) for the loops that run a thousand
calls; make_llama builds small random HF Llama models for the suites of
the PyTorch ops, and record_ops records which ops a piece of code runs."""

import importlib.util
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


@pytest.fixture(scope="session")
def make_llama():
    """make_llama(vocab, hidden, ff, heads, kv_heads, head_dim): a random
    2-layer LlamaForCausalLM in float32 on the CPU (seed 0)."""
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("no transformers module (scripts/install_deps.sh torch installs it)")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def make(vocab, hidden, ff, heads, kv_heads, head_dim):
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ff, num_hidden_layers=2,
                          num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                          max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False)
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg).float()

    return make


@pytest.fixture(scope="session")
def record_ops():
    """record_ops(): a context manager whose .ops lists the names of the ops
    ("nstf.flash_attn_bwd.default", ...) that reach the backends while it is
    active (below autograd: what runs, composite ops decomposed)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    return Record
