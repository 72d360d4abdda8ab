"""The lab supply server: a static file server for the apt repo, wheelhouse and Ascend files.

Stand-alone (stdlib only) so it can run as `python3 httpd.py` without ironserve installed.
It binds the lab bridge address only, so nothing outside the lab can reach it.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):  # one line per request, to the server log
        sys.stderr.write(f"{self.address_string()} {fmt % args}\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--pidfile", required=True)
    args = parser.parse_args(argv)
    handler = functools.partial(QuietHandler, directory=args.root)
    server = http.server.ThreadingHTTPServer((args.bind, args.port), handler)
    with open(args.pidfile + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()}\n")
    os.replace(args.pidfile + ".tmp", args.pidfile)  # written once listening: readiness signal
    server.serve_forever()


if __name__ == "__main__":
    main()
