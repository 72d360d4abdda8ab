"""Import: a pasted 'ENV=VAL ... python3 -m sglang.launch_server --flags' into recipe YAML.

The result renders back to the same argv (full flag names) and env. Known flags become typed fields,
the rest stay, in order, in server.extra_args; multi-node flags become topology.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from .flags import canonical, launcher_split, split_flags
from .lint import parse_pasted
from .spec import Recipe, ServerOptions

_SPECULATIVE = {
    "--speculative-algorithm": "algorithm",
    "--speculative-num-steps": "num_steps",
    "--speculative-eagle-topk": "eagle_topk",
    "--speculative-num-draft-tokens": "num_draft_tokens",
    "--speculative-draft-model-path": "draft_model_path",
    "--speculative-draft-model-quantization": "draft_model_quantization",
}
_RENDERER_OWNED = {"--dist-init-addr", "--nnodes", "--node-rank"}


def _typed_fields() -> dict[str, tuple[str, Any]]:
    out = {}
    for name, info in ServerOptions.model_fields.items():
        if name in ("speculative", "extra_args", "api_key_file"):
            continue
        out["--" + name.replace("_", "-")] = (name, info.annotation)
    return out


def _convert(annotation, values: list[str]):
    text = str(annotation)
    if "bool" in text:
        return True if not values else None
    if "list[int]" in text:
        return [int(v) for v in values]
    if len(values) != 1:
        return None
    value = values[0]
    try:
        if "dict" in text:
            return json.loads(value)
        if "int" in text and "float" not in text:
            return int(value)
        if "float" in text:
            return float(value)
    except ValueError:
        return None
    return value


def _family(model_path: str) -> str:
    m = model_path.lower()
    for pattern, family in ((r"glm-?5\.1", "glm5.1"), (r"glm-?5", "glm5"), ("kimi", "kimi-k2.5"),
                            ("minimax", "minimax-m2.5"), ("qwen3.5", "qwen3.5"), ("llama", "llama3")):
        if re.search(pattern, m):
            return family
    return "unknown"


# The image each hardware's seeds run, used when a command is imported without --engine.
ERA_IMAGE = {"sm120": "lmsysorg/sglang:dev-cu13", "sm100": "nvcr.io/nvidia/ai-dynamo/sglang-runtime:1.1.1-cuda13"}


def _runtime_for(arch: str, engine: str | None, launch: str) -> tuple[dict, dict]:
    from .lint import SEED_ERA

    if engine or arch not in ERA_IMAGE:
        version = engine or SEED_ERA.get(arch, "0.5.23")
        if not version[0].isdigit():
            version = "0.5.23"
        return ({"kind": "uv", "python": "3.12", "packages": [f"sglang=={version}"]},
                {"sglang": version, "launcher": launch})
    return ({"kind": "docker", "image": ERA_IMAGE[arch]}, {"sglang": SEED_ERA[arch], "launcher": launch})


def import_command(words: list[str], hardware: str, recipe_id: str | None = None,
                   engine: str | None = None, hardware_arch: str = "none") -> dict:
    env, argv = parse_pasted(words)
    launcher, flag_words = launcher_split(argv)
    if not launcher:
        raise ValueError("no command found: expected 'python3 -m sglang.launch_server ...' or 'sglang serve ...'")
    text = " ".join(launcher)
    if "sglang.launch_server" in text:
        launch = "launch_server"
    elif launcher[-2:] == ["sglang", "serve"] or text.endswith("sglang serve"):
        launch = "serve"
    else:
        raise ValueError(f"'{text}' is not an SGLang server command (launch_server or sglang serve)")
    typed = _typed_fields()
    server: dict[str, Any] = {}
    speculative: dict[str, Any] = {}
    extra: list[str] = []
    nnodes, dist_port = 1, None
    model_path = ""
    for name, values in split_flags(flag_words):
        flag = canonical(name)
        if flag == "--model-path":
            model_path = values[0] if values else ""
            continue
        if flag == "--nnodes":
            nnodes = int(values[0])
            continue
        if flag == "--dist-init-addr":
            dist_port = int(values[0].rsplit(":", 1)[1]) if ":" in values[0] else None
            continue
        if flag in _RENDERER_OWNED:
            continue
        if flag in _SPECULATIVE:
            key = _SPECULATIVE[flag]
            speculative[key] = int(values[0]) if values and values[0].isdigit() else values[0]
            continue
        if flag in typed:
            field, annotation = typed[flag]
            converted = _convert(annotation, values)
            if converted is not None:
                server[field] = converted
                continue
        extra += [flag, *values]
    if speculative:
        server["speculative"] = speculative
    if extra:
        server["extra_args"] = extra
    family = _family(model_path)
    runtime, engine_data = _runtime_for(hardware_arch, engine, launch)
    rid = recipe_id or re.sub(r"[^a-z0-9.]+", "-", f"{family}-{hardware}-imported".lower()).strip("-")
    group: dict[str, Any] = {"nodes": nnodes}
    if dist_port:
        group["dist_init_port"] = dist_port
    data: dict[str, Any] = {
        "id": rid,
        "description": f"Imported from a pasted command ({family} on {hardware})",
        "source": {"seed": "pasted", "section": "ironserve import"},
        "hardware": [hardware],
        "model": {"family": family, **({"path": model_path} if model_path.startswith("/") else {"hub_id": model_path})},
        "engine": engine_data,
        "runtime": runtime,
        "topology": {"kind": "multinode-tp", "groups": [group]} if nnodes > 1 else {"kind": "single"},
        "server": server,
    }
    if env:
        data["env"] = env
    Recipe.model_validate(data)  # what import writes must load
    return data


def to_yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
