// cudagate under NVRTC: <limits.h>'s constants come from cudagate_prelude.h (pre-included); the device
// math functions are NVRTC's built-ins.
#pragma once
