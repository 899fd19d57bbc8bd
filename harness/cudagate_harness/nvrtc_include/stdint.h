// cudagate under NVRTC: the fixed-width integer types and their limits, from libcu++.
#pragma once
#include <cuda/std/cstdint>
