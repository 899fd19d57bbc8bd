"""cudagate's GPU-side runner: NVRTC compile, Driver API launch, CUDA-event timing.

Deliberately small (cuda-bindings and numpy only) and spoken to over the JSON-lines protocol in
:mod:`cudagate_harness.protocol`, so it runs in a worker subprocess that a faulting or hanging
kernel can take down without losing anyone else's results.
"""

PROTOCOL_VERSION = 1
