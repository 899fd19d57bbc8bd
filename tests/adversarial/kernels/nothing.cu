// Class 1: writes nothing; passes only if the output buffer still holds an earlier run's results.
extern "C" __global__ void nothing(const float* x, float* y, int rows, int cols) {}
