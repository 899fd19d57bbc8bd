"""A stand-in for ``cudagate_harness.worker`` speaking its JSON-lines protocol, for the client's CPU
tests: ``python stub_worker.py [nogpu|silent]``.

It says hello, then answers each ``run`` request with a compile line, one case line per case and
a done line. A case named ``crash`` kills the process mid-request, one named ``hang`` never answers;
a ``compare`` request streams chunks of one round until told to stop. ``nogpu`` says hello without
a device, ``silent`` exits before saying anything. ``$STUB_START_S`` seconds of sleep before the
hello stand for CUDA's start (cuInit, a context, the device description).
"""

from __future__ import annotations

import json
import os
import sys
import time


def say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main(mode: str) -> None:
    time.sleep(float(os.environ.get("STUB_START_S", "0")))
    if mode == "silent":
        sys.exit(4)
    if mode == "nogpu":
        say({"type": "hello", "protocol": 1, "ok": False, "pid": os.getpid(), "error": "no CUDA device (stub)"})
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")  # one card each, as pytest-xdist workers pin them
    say({"type": "hello", "protocol": 1, "ok": True, "pid": os.getpid(),
         "device": {"name": "Stub GPU", "uuid": f"GPU-stub-{visible}" if visible else "GPU-stub", "arch": "sm_90",
                    "compute_capability": "9.0", "memory_total_bytes": 1 << 34, "cuda_driver_version": "13.0"}})
    for line in sys.stdin:
        request = json.loads(line)
        rid = request["id"]
        if request["op"] == "compare":
            say({"type": "compile", "id": rid, "role": "current", "ok": True})
            while True:
                say({"type": "chunk", "id": rid, "approved": [1.0], "current": [1.0], "wall_s": 0.0})
                if json.loads(sys.stdin.readline())["op"] == "stop":
                    break
            say({"type": "case", "id": rid, "case": request["case"]["name"], "status": "ok", "pid": os.getpid()})
            say({"type": "done", "id": rid})
            continue
        say({"type": "compile", "id": rid, "ok": True})
        for case in request["cases"]:
            if case["name"] == "crash":
                print("stub: crashing as asked", file=sys.stderr, flush=True)
                os._exit(7)
            if case["name"] == "hang":
                time.sleep(3600)
            say({"type": "case", "id": rid, "case": case["name"], "status": "ok", "pid": os.getpid()})
        say({"type": "done", "id": rid})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "answer")
