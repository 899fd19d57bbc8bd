// cudagate under NVRTC: printf is an NVRTC built-in; a kernel has no other use for <stdio.h>
// (files and streams are host code, which NVRTC refuses).
#pragma once
