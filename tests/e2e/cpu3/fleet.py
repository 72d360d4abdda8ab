"""Helpers of the cpu3 lab tests: the recipe's unit names, a chat completion, the router's address, a plan's changes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

RECIPE = "tiny-cpu"
ROUTER_UNIT = f"sglang-{RECIPE}-router"
SERVER_UNIT = f"sglang-{RECIPE}-server"  # + -<instance>


def chat(base: str, timeout: float = 60.0, key: str | None = None, max_tokens: int = 8) -> tuple[int, str]:
    """(HTTP status, answer text) of one short chat completion; (0, error) when nothing answered."""
    body = json.dumps(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hello, how are you?"}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
    ).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
            return resp.status, data["choices"][0]["message"]["content"] or ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:300]
    except (OSError, ValueError, KeyError) as exc:
        return 0, f"{type(exc).__name__}: {exc}"


def changes(plan: list[dict]) -> list[str]:
    return [
        f"{op['name']} on {op['hosts_with_change'] + op['hosts_with_conditional_change']}"
        for op in plan
        if op["hosts_with_change"] or op["hosts_with_conditional_change"]
    ]


def router_base(lab) -> str:
    router = lab["hosts"][0]
    return f"http://{router['address']}:30000"
