"""A client of its own process sending chat completions through the router until told to stop (bounded).

Run by the day-two lab tests (``python -m tests.e2e.cpu3.load_client BASE RESULTS``; the key, if any, in
``LOAD_CLIENT_KEY``). A process, never a thread of pytest: pyinfra's inventory loader, imported by other lab
modules, patches threads into gevent greenlets, which a blocking wait of the test would starve. Each answer is one
JSON line appended to RESULTS as it comes (a killed client leaves what it saw); SIGTERM ends the loop after the
request in flight; SIGUSR1 writes the stack to stderr (where a request that never answers waits).
"""

from __future__ import annotations

import faulthandler
import json
import signal
import sys
import time

from .fleet import chat

MAX_REQUESTS = 5000  # bounds per run: count and time
MAX_CLIENT_S = 1500
CHAT_TIMEOUT_S = 30  # a short chat through the router answers in well under a second; 30s is an outage
# each answer is two tokens: a whole request through the router and a replica, at under half the engine CPU of the
# 8-token chats of the other tests (the client runs for as long as each roll, beside it on the same cores)
MAX_TOKENS = 2
# a steady stream, paced: a router or replica away for longer than this fails a request, and the two replicas
# (sharing the lab machine's cores with the roll they serve through) are not kept busy by the client alone
PACE_S = 0.2


def main(base: str, results: str, key: str | None) -> None:
    halted = []
    signal.signal(signal.SIGTERM, lambda *_: halted.append(True))
    faulthandler.register(signal.SIGUSR1, file=sys.stderr)
    started, count = time.monotonic(), 0
    with open(results, "a", encoding="utf-8") as out:
        while not halted and count < MAX_REQUESTS and time.monotonic() - started < MAX_CLIENT_S:
            code, text = chat(base, timeout=CHAT_TIMEOUT_S, key=key, max_tokens=MAX_TOKENS)
            out.write(json.dumps([time.monotonic(), code, text[:200]]) + "\n")
            out.flush()
            count += 1
            time.sleep(PACE_S)


if __name__ == "__main__":
    import os

    main(sys.argv[1], sys.argv[2], os.environ.get("LOAD_CLIENT_KEY") or None)
