"""Run one command with llama.cpp's server up: the recipe's LLM_SERVER=llamacpp.

    with_llm_server.py --model smollm2 [--log FILE] [--server-arg ARG ...] -- COMMAND ... {url} ...

starts ``python -m llama_cpp.server`` on the model's GGUF file on a free loopback port (retrctl.llm.llamacpp),
waits until it answers, runs COMMAND with every ``{url}`` replaced by the server's /v1 URL, stops the server
however COMMAND ends, and exits with COMMAND's status (2 when the server cannot start).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

from retrctl.llm.llamacpp import LlamaCppServer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="a shipped name (smollm2) or a .gguf file")
    ap.add_argument("--log", help="the server's log file (default: a temporary file, removed when the server is stopped "
                    "and kept when it failed or ended on its own)")
    ap.add_argument("--server-arg", action="append", default=[], help="one more server flag or value (repeatable)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run; {url} is the server's URL")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    # make's Ctrl-C and kill reach us as signals: unwind through the finally below so the server is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        server = LlamaCppServer(args.model, args=args.server_arg, log_path=args.log).start()
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"with_llm_server.py: {e}", file=sys.stderr)
        return 2
    try:
        print(f"with_llm_server.py: llama.cpp's server on {server.gguf.name} at {server.url}", file=sys.stderr)
        status = subprocess.call([part.replace("{url}", server.url) for part in command])
        if server.ended():  # the command's own error says only that the server stopped answering
            print(f"with_llm_server.py: llama.cpp's server ended during the command ({server.ended()}); its log "
                  f"({server.log_path}) ends:\n{server.log_tail()}", file=sys.stderr)
        return status
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
