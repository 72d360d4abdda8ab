"""The lab's CPU runtime of SGLang: the tiny model, the shim wheel, the pins, and (marker cpu_serving) real serving.

The fast tests need nothing but the standard library. ``-m cpu_serving`` runs benchmarks/tiny_cpu_serving.py:
downloads the wheelhouse once (~850 MiB, PyPI + /opt/wheels), builds a venv from it offline, starts two real
SGLang servers and the real sglang-router on 127.0.0.1 and kills one worker (5-10 minutes on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from ironserve_lab import cpu_runtime, pinfiles, tiny_model
from ironserve_lab.wheels import _record_hash

from ironserve import catalogue
from ironserve import engine_parser as ep

from .ci import need_parser_prerequisites

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- tiny model


def test_tiny_model_is_deterministic_and_manifested(tmp_path):
    a = tiny_model.generate(tmp_path / "a")
    b = tiny_model.generate(tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert (
        names
        == sorted(p.name for p in b.iterdir())
        == [
            "config.json",
            "generation_config.json",
            "ironserve-manifest.sha256",
            "model.safetensors",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    lines = (a / tiny_model.MANIFEST).read_text().splitlines()
    assert len(lines) == len(names) - 1
    for line in lines:  # sha256sum -c format, paths relative to the model directory
        digest, name = line.split("  ", 1)
        assert hashlib.sha256((a / name).read_bytes()).hexdigest() == digest
    # a second run over the same directory rewrites nothing
    before = {n: (a / n).stat().st_mtime_ns for n in names}
    tiny_model.generate(a)
    assert before == {n: (a / n).stat().st_mtime_ns for n in names}


def test_tiny_model_config_safetensors_and_tokenizer_agree(tmp_path):
    root = tiny_model.generate(tmp_path)
    cfg = json.loads((root / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 2
    assert cfg["hidden_size"] == 64 and cfg["num_key_value_heads"] == 2 and cfg["vocab_size"] == 320
    raw = (root / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    assert (8 + n) % 8 == 0
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert len(tensors) == 3 + 9 * cfg["num_hidden_layers"]
    assert tensors["model.embed_tokens.weight"]["shape"] == [cfg["vocab_size"], cfg["hidden_size"]]
    assert all(t["dtype"] == "BF16" for t in tensors.values())
    assert max(t["data_offsets"][1] for t in tensors.values()) == len(raw) - 8 - n
    tok = json.loads((root / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert len(vocab) == cfg["vocab_size"] and sorted(vocab.values()) == list(range(cfg["vocab_size"]))
    assert all(a + b in vocab for a, b in tok["model"]["merges"])
    tcfg = json.loads((root / "tokenizer_config.json").read_text())
    assert "add_generation_prompt" in tcfg["chat_template"]
    assert vocab[tcfg["bos_token"]] == cfg["bos_token_id"] and vocab[tcfg["eos_token"]] in cfg["eos_token_id"]


def test_tiny_model_bf16_rounding():
    assert tiny_model._bf16(1.0) == 0x3F80 and tiny_model._bf16(-2.0) == 0xC000
    assert tiny_model._bf16(1.0 + 2**-8) == 0x3F80  # halfway: round to even
    assert tiny_model._bf16(1.0 + 3 * 2**-8) == 0x3F82


def test_tiny_model_cli(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ironserve_lab.tiny_model", str(tmp_path / "m")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run(
        ["sha256sum", "-c", "--quiet", tiny_model.MANIFEST], cwd=tmp_path / "m", capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parser
def test_tiny_tokenizer_loads_in_the_tokenizers_library(tmp_path):
    """The real tokenizers library (not in the project venv): the one a cached SGLang parser venv carries."""
    need_parser_prerequisites()
    python = ep.parser_env("0.5.9") / "bin" / "python"
    load = (
        "import sys\nfrom tokenizers import Tokenizer\n"
        "tok = Tokenizer.from_file(sys.argv[1])\ntext = sys.argv[2]\n"
        "assert tok.decode(tok.encode(text).ids) == text, tok.decode(tok.encode(text).ids)\n"
    )
    tokenizer = tiny_model.generate(tmp_path) / "tokenizer.json"
    proc = subprocess.run(
        [str(python), "-c", load, str(tokenizer), "Hello, how are you? ünïcode"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- pins, recipe, uv config


@pytest.mark.parametrize("recipe", ["tiny-cpu", "tiny-cpu-tp2"])
def test_recipe_pins_are_the_cpu_runtime(recipe):
    """The CPU runtime's pins (requirements/cpu.txt, read at run time) are the cpu-lab recipes' packages."""
    r = catalogue.catalogue()[recipe]
    assert r.runtime.packages == cpu_runtime.REQUIREMENTS == pinfiles.read("cpu.txt")
    assert r.runtime.python == cpu_runtime.PYTHON == "3.11"
    assert r.engine.sglang == cpu_runtime.SGLANG_VERSION and r.engine.router == cpu_runtime.ROUTER_VERSION


CPU_LAB_RECIPES = sorted(r.id for r in catalogue.catalogue().values() if "cpu-lab" in r.hardware)


@pytest.mark.parametrize("recipe", CPU_LAB_RECIPES)
def test_every_cpu_lab_recipe_serves_with_the_runtimes_env(recipe):
    """Every server of the lab's CPU engine: SGLang's CPU platform, offline, one torch intra-op thread."""
    env = catalogue.catalogue()[recipe].env
    assert {key: env.get(key) for key in cpu_runtime.SERVER_ENV} == cpu_runtime.SERVER_ENV


def test_cpu_runtime_has_no_cuda_and_no_duplicates():
    names = [cpu_runtime.normalize(p.split("==")[0]) for p in cpu_runtime.REQUIREMENTS]
    assert len(names) == len(set(names))
    assert not [n for n in names if cpu_runtime._CUDA_WHEEL.match(n)]
    assert not set(names) & {cpu_runtime.normalize(n) for n in cpu_runtime.EXCLUDED}
    assert f"torch=={cpu_runtime.TORCH_VERSION}" in cpu_runtime.REQUIREMENTS
    assert "nvidia-ml-py" in names  # pure-Python NVML bindings, not CUDA


def test_uv_config_excludes_and_overrides():
    cfg = tomllib.loads(cpu_runtime.uv_config())
    assert cfg["exclude-dependencies"] == list(cpu_runtime.EXCLUDED)
    assert cfg["override-dependencies"] == ["torch==2.13.0+cpu"]


def test_download_command_is_exact_and_binary_only(tmp_path):
    cmd = cpu_runtime.download_command(tmp_path, ["sglang==0.5.23"])
    assert "--no-deps" in cmd and cmd[cmd.index("--only-binary") + 1] == ":all:"
    assert cmd[cmd.index("--python-version") + 1] == "3.11"
    plats = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--platform"]
    assert plats[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in plats
    assert cmd[-1] == "sglang==0.5.23"


def test_check_wheelhouse_names_missing_and_cuda_wheels(tmp_path):
    (tmp_path / "nvidia_cuda_runtime-13.5.37-py3-none-manylinux_2_28_x86_64.whl").write_bytes(b"")
    problems = cpu_runtime.check_wheelhouse(tmp_path)
    assert any(p.startswith("sglang==0.5.23: no wheel") for p in problems)
    assert any("CUDA-only wheel" in p for p in problems)


def test_a_wheelhouse_of_earlier_pins_is_pruned_not_refused(tmp_path):
    """A cached wheelhouse of an earlier runtime (a distribution since left out, another version of a pin) loses
    those wheels and keeps the pinned ones: an upgrade of the pins must not stop `lab up`."""
    kept = "aiohttp-3.14.5-cp311-cp311-manylinux2014_x86_64.whl"
    gone = ["anthropic-2.12.0-py3-none-any.whl", "aiohttp-3.14.4-cp311-cp311-manylinux2014_x86_64.whl"]
    for name in [kept, *gone]:
        (tmp_path / name).write_bytes(b"")
    assert cpu_runtime.prune_wheelhouse(tmp_path) == sorted(gone)
    assert sorted(p.name for p in tmp_path.glob("*.whl")) == [kept]
    assert not [p for p in cpu_runtime.check_wheelhouse(tmp_path) if "not a pin" in p]


# --------------------------------------------------------------------------- the shim wheel


def test_shim_wheel_is_byte_stable_and_complete(tmp_path):
    a = cpu_runtime.build_shim_wheel(tmp_path / "a")
    b = cpu_runtime.build_shim_wheel(tmp_path / "b")
    assert a.name == "ironserve_lab_cpu_shims-0.1.0-py3-none-any.whl"
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        names = zf.namelist()
        assert "sgl_kernel/__init__.py" in names and "torchvision/transforms/functional.py" in names
        dist = "ironserve_lab_cpu_shims-0.1.0.dist-info"
        meta = zf.read(f"{dist}/METADATA").decode()
        assert "Name: ironserve-lab-cpu-shims" in meta and "lab" in meta
        record = zf.read(f"{dist}/RECORD").decode().splitlines()
        assert {line.split(",")[0] for line in record} == set(names)
        for line in record:
            name, digest, size = line.split(",")
            if digest:
                assert digest == _record_hash(zf.read(name)) and int(size) == len(zf.read(name))


def _shim_python(code: str) -> subprocess.CompletedProcess:
    """Run code with only the shim sources on the path (no torch needed for the shims themselves)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(cpu_runtime.SHIM_SOURCE), str(cpu_runtime.SHARED_SHIMS)])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_sgl_kernel_shim_imports_anything_and_raises_when_called():
    proc = _shim_python(
        "import sgl_kernel\n"
        "from sgl_kernel import copy_all_layer_kv_cache_cpu, rmsnorm\n"
        "assert sgl_kernel.IRONSERVE_SHIM and 'shim' in sgl_kernel.__version__\n"
        "try:\n    rmsnorm(1, 2)\nexcept NotImplementedError as e:\n    print(e)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "sgl_kernel.rmsnorm is not implemented by the ironserve lab CPU shim" in proc.stdout


def test_torchvision_shim_is_inert():
    proc = _shim_python(
        "import torchvision.transforms as T\n"
        "from torchvision.transforms import InterpolationMode\n"
        "assert InterpolationMode.BICUBIC.value == 'bicubic'\n"
        "try:\n    T.Resize(3)\nexcept RuntimeError as e:\n    print(e)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "torchvision is an ironserve shim" in proc.stdout


# --------------------------------------------------------------------------- real serving


@pytest.mark.cpu_serving
def test_real_sglang_on_cpu_behind_the_router(tmp_path):
    # real SGLang serving (minutes, downloads ~850 MiB once): deselected unless -m cpu_serving (tests/ci.py)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import tiny_cpu_serving as bench
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    result = bench.run(tmp_path, int(os.environ.get("IRONSERVE_CPU_SERVING_PORT", "31000")), 900.0)
    print(json.dumps(result, sort_keys=True))
    assert result["checks"] == {k: True for k in result["checks"]}, result
    assert result["ok"], result
    assert result["first_request"]["status"] == 200 and result["first_request"]["content"]
    assert result["after_kill"]["ok"] == result["after_kill"]["requests"]
