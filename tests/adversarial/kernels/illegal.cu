// Class 11: writes far outside any allocation (a sticky illegal address).
extern "C" __global__ void illegal(const float* x, float* y, int rows, int cols)
{
    y[(size_t)1 << 40] = x[0];
}
