"""The stand-in GPU images' venv layer (lab/ironserve_lab/parser_layer.py), offline (no root, no lab): a venv layer
written by GNU tar as the runtime image writes it, cut to the parser's distributions and what they require.

The cut layer runs in the lab hosts' real Docker engine (tests/e2e/test_deploy_glm5_lab.py: the parse check in the
image, the derived builds).
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile

import pytest
from ironserve_lab import oci, parser_layer
from ironserve_lab.system import LabError

from ironserve import engine_parser

SITE = "opt/sglang/lib/python3.11/site-packages"


def _dist(root, name: str, requires: list[str], files: dict[str, str]) -> None:
    """A distribution installed as uv installs one: its files, METADATA and a RECORD (CSV, paths quoted as needed)."""
    site = root / SITE
    info = f"{name.replace('-', '_')}-1.0.dist-info"
    (site / info).mkdir(parents=True)
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    (site / info / "METADATA").write_text(metadata + "\nthe description\n")
    rows = [*files, f"{info}/METADATA", f"{info}/RECORD"]
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (site / info / "RECORD").write_text("".join((f'"{r}"' if "," in r else r) + ",,\n" for r in rows))


def _venv_layer(tmp_path) -> tuple:
    root = tmp_path / "upper"
    (root / "opt/sglang").mkdir(parents=True)
    (root / "opt/sglang/pyvenv.cfg").write_text("home = /usr/bin\nversion_info = 3.11.2.final.0\n")
    _dist(
        root,
        "parser-root",
        ["needed-dep>=1", 'old-only; python_version < "3.8"', "extra-dep; extra == 'x'"],
        {"parser_root/__init__.py": "a\n"},
    )
    _dist(root, "needed-dep", [], {"needed_dep/__init__.py": "b\n", "needed_dep/data/E=1,N=2.json": "{}\n"})
    for name in ("old-only", "extra-dep"):
        _dist(root, name, [], {f"{name.replace('-', '_')}/__init__.py": "c\n"})
    _dist(
        root,
        "serving-only",
        [],
        {"serving_only/__init__.py": "d\n", "serving_only/sub/E=1,N=2.json": "{}\n", "../../../bin/serve": "#!\n"},
    )
    for pkg in ("serving_only", "needed_dep"):
        (root / SITE / pkg / "__pycache__").mkdir()
        (root / SITE / pkg / "__pycache__/__init__.cpython-311.pyc").write_bytes(b"pyc")
    (root / SITE / "distutils-precedence.pth").write_text("owned by no distribution\n")
    (root / "opt/sglang/empty").mkdir()
    store = tmp_path / "store"
    return store, oci.layer_from_dir(store, root, normalize_mtime=True)


def _names(store, layer) -> set[str]:
    with tarfile.open(oci.blob_path(store, layer["digest"])) as tar:
        return {m.name.removeprefix("./").rstrip("/") for m in tar}


def test_the_cut_keeps_the_parsers_distributions_and_their_requirements(tmp_path, monkeypatch):
    """What the roots require (markers for the venv's Python, no extras) stays with its files, bytecode and data; the
    other distributions' files, bytecode, scripts and emptied directories go; what no distribution owns stays."""
    monkeypatch.setattr(parser_layer, "roots", lambda: ["parser-root"])
    store, layer = _venv_layer(tmp_path)
    cut = parser_layer.cut(store, layer)
    names = _names(store, cut)
    site = SITE
    assert {
        f"{site}/parser_root/__init__.py",
        f"{site}/needed_dep/data/E=1,N=2.json",
        f"{site}/needed_dep/__pycache__/__init__.cpython-311.pyc",
        f"{site}/needed_dep-1.0.dist-info/RECORD",
        f"{site}/distutils-precedence.pth",
        "opt/sglang/pyvenv.cfg",
        "opt/sglang/empty",
    } <= names
    gone = [n for n in names if any(p in n for p in ("serving_only", "old_only", "extra_dep", "opt/sglang/bin"))]
    assert gone == []  # an empty serving_only/ left behind would import as a namespace package
    assert cut["digest"] == cut["diff_id"] and cut["size"] == oci.blob_path(store, cut["digest"]).stat().st_size


def test_the_cut_is_the_runtime_layers_own_records_and_a_valid_tar(tmp_path, monkeypatch):
    """Kept members are the source's records byte for byte (owner, mode, mtime, content); GNU tar reads the cut; the
    same source cuts to the same digest, cached by the source's digest."""
    monkeypatch.setattr(parser_layer, "roots", lambda: ["parser-root"])
    store, layer = _venv_layer(tmp_path)
    cut = parser_layer.cut(store, layer)
    subprocess.run(["tar", "-tf", oci.blob_path(store, cut["digest"])], check=True, capture_output=True)
    with (
        tarfile.open(oci.blob_path(store, layer["digest"])) as src,
        tarfile.open(oci.blob_path(store, cut["digest"])) as dst,
    ):
        before = {m.name: (m.mode, m.uid, m.mtime, m.size, m.isfile() and src.extractfile(m).read()) for m in src}
        after = {m.name: (m.mode, m.uid, m.mtime, m.size, m.isfile() and dst.extractfile(m).read()) for m in dst}
    assert after and all(before[name] == attrs for name, attrs in after.items())
    os.unlink(oci.blob_path(store, cut["digest"]))
    assert parser_layer.cut(store, layer) == cut  # cut again from the same records: the same bytes
    records = list((store / "images").glob("parser-layer-*.json"))
    assert [json.loads(r.read_text()) for r in records] == [cut]


def test_a_parser_distribution_the_venv_lacks_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(parser_layer, "roots", lambda: ["parser-root", "not-installed"])
    store, layer = _venv_layer(tmp_path)
    with pytest.raises(LabError, match="lacks not-installed"):
        parser_layer.cut(store, layer)


def test_the_roots_are_the_parser_venvs_own_distributions():
    """One list for both: what the lint's parser venvs install is what the stand-ins keep (with the shims)."""
    roots = parser_layer.roots()
    assert {"torch", "transformers", "triton", "pillow", "pyzmq", "ironserve-lab-cpu-shims"} <= set(roots)
    assert len(roots) == len(engine_parser.parser_distributions()) + 1
