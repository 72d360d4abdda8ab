"""Real SGLang on the CPU, on this machine: two servers of the tiny model behind the real sglang-router.

What the lab's cpu-lab hosts do, minus the hosts (everything on 127.0.0.1, nothing else on the network):

1. the wheelhouse of ``ironserve_lab.cpu_runtime`` (downloaded once into
   ``${IRONSERVE_CACHE:-~/.cache/ironserve}/lab-cpu-wheelhouse/<sglang>/``; torch from /opt/wheels);
2. a venv installed from it OFFLINE with a plain ``uv pip install --no-index --find-links`` of the
   recipe's pins, with the lab hosts' ``/etc/uv/uv.toml`` (``cpu_runtime.uv_config()``) found through
   ``XDG_CONFIG_DIRS`` -- the install the uv role does on a host, resolution included;
3. the tiny model (``ironserve_lab.tiny_model``);
4. the recipe ``tiny-cpu`` rendered by ironserve: its two server argvs and its router argv, with the
   host/port/model path/worker URLs moved to 127.0.0.1 and the recipe's env (SGLANG_USE_CPU_ENGINE=1);
5. a chat completion through the router (200, a non-empty choice), a few more for tokens/s;
6. one worker killed (SIGKILL to its whole process group), then bounded requests through the router,
   which must still answer 200 (retries move a request off the dead worker; the health checks of the
   recipe's router flags take it out of rotation).

Every wait and request loop is bounded in count and time. Prints figures and one JSON line; exit 0 when
every check passed.

    .venv/bin/python benchmarks/tiny_cpu_serving.py [--work DIR] [--keep] [--port-base 31000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "lab")]  # this checkout's product and lab

from ironserve_lab import cpu_runtime, tiny_model  # noqa: E402

from ironserve import catalogue  # noqa: E402
from ironserve.render import render  # noqa: E402

RECIPE = "tiny-cpu"
HOST = "127.0.0.1"
PROMPT = [{"role": "user", "content": "Hello, how are you?"}]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def http(method: str, url: str, body: dict | None = None, timeout: float = 60.0) -> tuple[int, dict | str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode(errors="replace")
            status = resp.status
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")[:500]
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        return 0, str(err)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def wait_healthy(url: str, deadline_s: float, proc: subprocess.Popen | None = None, every: float = 1.0) -> float | None:
    """Seconds until GET url answers 200; None when the deadline passes or the process exits."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc is not None and proc.poll() is not None:
            return None
        status, _ = http("GET", url, timeout=5)
        if status == 200:
            return time.monotonic() - t0
        time.sleep(every)
    return None


def healthy_workers(base: str) -> int:
    status, answer = http("GET", f"{base}/workers", timeout=5)
    if status != 200 or not isinstance(answer, dict):
        return 0
    return sum(1 for w in answer.get("workers", []) if w.get("is_healthy"))


def wait_workers(base: str, count: int, deadline_s: float, proc: subprocess.Popen) -> float | None:
    """Seconds until the router lists ``count`` healthy workers (GET /workers); None past the deadline."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            return None
        if healthy_workers(base) >= count:
            return time.monotonic() - t0
        time.sleep(0.25)
    return None


def chat(base: str, max_tokens: int = 16, timeout: float = 120.0) -> dict:
    body = {"model": "tiny", "messages": PROMPT, "max_tokens": max_tokens, "temperature": 0}
    t0 = time.monotonic()
    status, answer = http("POST", f"{base}/v1/chat/completions", body, timeout=timeout)
    elapsed = time.monotonic() - t0
    out = {"status": status, "seconds": round(elapsed, 3)}
    if status == 200 and isinstance(answer, dict):
        choices = answer.get("choices") or [{}]
        out["content"] = (choices[0].get("message") or {}).get("content") or ""
        out["completion_tokens"] = (answer.get("usage") or {}).get("completion_tokens", 0)
    else:
        out["error"] = str(answer)[:300]
    return out


def ok(res: dict) -> bool:
    return res["status"] == 200 and bool(res.get("content"))


# --------------------------------------------------------------------------- build


def build_venv(work: Path, wheelhouse: Path) -> Path:
    venv = work / "venv"
    uv = shutil.which("uv")
    if not uv:
        raise SystemExit("uv is required")
    xdg = work / "xdg"
    (xdg / "uv").mkdir(parents=True, exist_ok=True)
    (xdg / "uv" / "uv.toml").write_text(cpu_runtime.uv_config())  # what /etc/uv/uv.toml is on a lab host
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_", "PIP_"))}
    env.update({"XDG_CONFIG_DIRS": str(xdg), "UV_OFFLINE": "1", "UV_NO_PROGRESS": "1"})
    if not (venv / "bin" / "python").exists():
        subprocess.run(
            [uv, "venv", "--quiet", "--python", cpu_runtime.PYTHON, str(venv)], check=True, env=env, cwd=work
        )
    cmd = cpu_runtime.install_command(uv, str(venv / "bin" / "python"), wheelhouse)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"offline install failed:\n{proc.stderr[-4000:]}")
    freeze = subprocess.run(
        [uv, "pip", "freeze", "--python", str(venv / "bin" / "python")],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.split()
    cuda = [f for f in freeze if cpu_runtime._CUDA_WHEEL.match(f)]
    if cuda:
        raise SystemExit(f"CUDA distributions in the CPU venv: {cuda}")
    wanted = {cpu_runtime.normalize(r.split("==")[0]): r.split("==")[1] for r in cpu_runtime.REQUIREMENTS}
    have = {cpu_runtime.normalize(f.split("==")[0]): f.split("==")[1] for f in freeze if "==" in f}
    extra = sorted(set(have) - set(wanted))
    wrong = sorted(n for n in wanted if have.get(n) != wanted[n])
    if extra or wrong:
        raise SystemExit(f"venv differs from the pins: extra {extra}, wrong/missing {wrong}")
    return venv


# --------------------------------------------------------------------------- processes


def processes(model: Path, venv: Path, ports: list[int], router_port: int) -> tuple[list[dict], dict]:
    """The recipe's rendered server and router commands, moved to 127.0.0.1 and this venv."""
    recipe = catalogue.catalogue()[RECIPE]
    rendered = render(recipe).processes
    servers = [p for p in rendered if p.role == "server"]
    (router,) = [p for p in rendered if p.role == "router"]
    python = str(venv / "bin" / "python")
    out = []
    for p, port in zip(servers, ports):
        argv = list(p.argv)
        argv[0] = python
        for flag, value in (("--host", HOST), ("--port", str(port)), ("--model-path", str(model))):
            argv[argv.index(flag) + 1] = value
        out.append({"argv": argv, "env": dict(p.env), "url": f"http://{HOST}:{port}"})
    argv = list(router.argv)
    argv[0] = python
    i = argv.index("--worker-urls") + 1
    argv[i : i + len(servers)] = [s["url"] for s in out]
    for flag, value in (("--host", HOST), ("--port", str(router_port))):
        argv[argv.index(flag) + 1] = value
    return out, {"argv": argv, "env": dict(router.env), "url": f"http://{HOST}:{router_port}"}


def start(spec: dict, logfile: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(spec["env"])
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": "",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "NO_PROXY": HOST,
            "no_proxy": HOST,
        }
    )
    fh = open(logfile, "wb")
    return subprocess.Popen(
        spec["argv"], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=logfile.parent, start_new_session=True
    )


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, wait_s: float = 30.0) -> None:
    """Signal the process group this script started (start_new_session) and wait, bounded."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def reference_text(venv: Path, model: Path, max_tokens: int) -> str | None:
    """transformers' own greedy continuation of PROMPT (same weights): what SGLang should answer."""
    script = (
        "import sys, torch; from transformers import AutoTokenizer, AutoModelForCausalLM\n"
        f"tok = AutoTokenizer.from_pretrained({str(model)!r}); m = AutoModelForCausalLM.from_pretrained({str(model)!r})\n"
        f"ids = tok.apply_chat_template({PROMPT!r}, add_generation_prompt=True, tokenize=True, return_dict=True)['input_ids']\n"
        f"out = m.generate(torch.tensor([ids]), max_new_tokens={max_tokens}, do_sample=False)\n"
        "sys.stdout.write(tok.decode(out[0][len(ids):], skip_special_tokens=True))\n"
    )
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    return proc.stdout if proc.returncode == 0 else None


# --------------------------------------------------------------------------- main


def run(work: Path, port_base: int, health_timeout: float, wheelhouse: Path | None = None) -> dict:
    result: dict = {
        "sglang": cpu_runtime.SGLANG_VERSION,
        "router": cpu_runtime.ROUTER_VERSION,
        "torch": cpu_runtime.TORCH_VERSION,
        "checks": {},
    }
    checks = result["checks"]
    wheelhouse = wheelhouse or cpu_runtime.RUNTIME.wheelhouse()
    t0 = time.monotonic()
    log(f"wheelhouse {wheelhouse}")
    summary = cpu_runtime.build_wheelhouse(wheelhouse)
    result["wheelhouse"] = {"wheels": summary["wheels"], "mib": round(summary["bytes"] / 2**20)}
    result["wheelhouse_s"] = round(time.monotonic() - t0, 1)

    t0 = time.monotonic()
    log("venv from the wheelhouse (offline, lab uv.toml)")
    venv = build_venv(work, wheelhouse)
    result["venv_s"] = round(time.monotonic() - t0, 1)

    model = tiny_model.generate(work / "model")
    ports = [port_base + 1, port_base + 2]
    servers, router = processes(model, venv, ports, port_base)
    result["server_argv"] = servers[0]["argv"][1:]
    result["router_argv"] = router["argv"][1:]
    procs: list[subprocess.Popen] = []
    try:
        log(f"starting 2 servers on {HOST}:{ports}")
        t0 = time.monotonic()
        for n, spec in enumerate(servers):
            procs.append(start(spec, work / f"server{n}.log"))
        startup = []
        for spec, proc in zip(servers, procs):
            waited = wait_healthy(f"{spec['url']}/health", health_timeout - (time.monotonic() - t0), proc)
            startup.append(None if waited is None else round(time.monotonic() - t0, 1))
        result["server_startup_s"] = startup
        checks["servers_healthy"] = all(s is not None for s in startup)
        if not checks["servers_healthy"]:
            raise RuntimeError("a server did not become healthy; see server*.log in " + str(work))
        log(f"servers healthy after {startup} s")

        t0 = time.monotonic()
        rproc = start(router, work / "router.log")
        procs.append(rproc)
        waited = wait_healthy(f"{router['url']}/health", 120, rproc, every=0.25)
        result["router_startup_s"] = None if waited is None else round(waited, 2)
        checks["router_healthy"] = waited is not None
        if waited is None:
            raise RuntimeError("the router did not become healthy; see router.log")
        # /health answers before the workers are registered (that runs in the background): a request
        # then gets 503 no_available_workers. Ready = every worker registered and healthy.
        ready = wait_workers(router["url"], len(servers), 120 - waited, rproc)
        result["router_ready_s"] = None if ready is None else round(time.monotonic() - t0, 2)
        result["router_readiness_endpoint"] = http("GET", f"{router['url']}/readiness", timeout=5)[0]
        checks["router_ready"] = ready is not None
        if ready is None:
            raise RuntimeError("the router did not register both workers; see router.log")

        first = chat(router["url"])
        result["first_request"] = first
        checks["chat_200"] = ok(first)
        log(f"first chat completion through the router: {first}")

        reference = reference_text(venv, model, 16)
        result["transformers_greedy"] = reference
        result["matches_transformers_greedy"] = reference is not None and first.get("content") == reference

        # throughput: a bounded number of sequential requests, 64 tokens each
        runs, tokens, t0 = [], 0, time.monotonic()
        for _ in range(6):
            r = chat(router["url"], max_tokens=64)
            runs.append(r)
            tokens += r.get("completion_tokens", 0)
            if time.monotonic() - t0 > 180:
                break
        elapsed = time.monotonic() - t0
        result["sequential"] = {
            "requests": len(runs),
            "ok": sum(ok(r) for r in runs),
            "tokens": tokens,
            "tokens_per_s": round(tokens / elapsed, 1) if elapsed else None,
            "latencies_s": [r["seconds"] for r in runs],
        }
        checks["sequential_200"] = all(ok(r) for r in runs)

        # kill one worker: its whole process group (launch_server, scheduler, detokenizer)
        log(f"killing worker {servers[0]['url']} (SIGKILL to its process group)")
        stop(procs[0], signal.SIGKILL, wait_s=10)
        t_kill = time.monotonic()
        after, t0 = [], time.monotonic()
        for _ in range(10):
            after.append(chat(router["url"], timeout=60))
            if time.monotonic() - t0 > 240:
                break
        result["after_kill"] = {
            "requests": len(after),
            "ok": sum(ok(r) for r in after),
            "statuses": [r["status"] for r in after],
            "max_latency_s": max(r["seconds"] for r in after),
        }
        checks["survives_worker_kill"] = all(ok(r) for r in after)
        log(f"after the kill: {result['after_kill']}")
        # the router's health checks (recipe: every 5 s, 2 failures) take the dead worker out of rotation
        t1 = time.monotonic()
        while healthy_workers(router["url"]) > 1 and time.monotonic() - t1 < 90:
            time.sleep(0.5)
        result["dead_worker_out_of_rotation_s"] = (
            round(time.monotonic() - t_kill, 1) if healthy_workers(router["url"]) == 1 else None
        )
        checks["dead_worker_out_of_rotation"] = result["dead_worker_out_of_rotation_s"] is not None
        last = chat(router["url"], timeout=60)
        result["after_removal"] = last
        checks["after_removal_200"] = ok(last)
    except RuntimeError as err:
        result["error"] = str(err)
    finally:
        for proc in reversed(procs):
            stop(proc)
    result["ok"] = bool(checks) and all(checks.values()) and "error" not in result
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="working directory (default: a temporary one, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the working directory (venv, model, logs)")
    ap.add_argument("--port-base", type=int, default=31000, help="router port; servers on +1 and +2")
    ap.add_argument("--health-timeout", type=float, default=600.0, help="seconds for both servers to be healthy")
    ap.add_argument("--wheelhouse", type=Path, help="wheelhouse directory (default: the cache)")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="ironserve-tiny-cpu-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = run(work.resolve(), args.port_base, args.health_timeout, args.wheelhouse)
    finally:
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"sglang {result['sglang']} + sglang-router {result['router']} + torch {result['torch']} on CPU")
    for key in (
        "wheelhouse",
        "wheelhouse_s",
        "venv_s",
        "server_startup_s",
        "router_startup_s",
        "router_ready_s",
        "router_readiness_endpoint",
        "first_request",
        "transformers_greedy",
        "matches_transformers_greedy",
        "sequential",
        "after_kill",
        "dead_worker_out_of_rotation_s",
        "after_removal",
        "checks",
        "error",
    ):
        if key in result:
            print(f"  {key}: {result[key]}")
    print(json.dumps(result, sort_keys=True))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
