// The two known kernels of kinetrace-gpu-workload. Compiled at run time with NVRTC when libnvrtc
// loads; otherwise the committed kernels.ptx (generated from this file by regen.sh) is JIT-compiled
// by the driver. Keep both in step: run regen.sh after editing.

// Kernel A: c[i] = a[i] + b[i].
extern "C" __global__ void kt_vadd(const float *a, const float *b, float *c, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}

// Kernel B: spins for `ns` nanoseconds of the GPU's global timer, so its duration is known.
// Writes the time it measured to out[0] (thread 0 of block 0).
extern "C" __global__ void kt_busy(unsigned long long ns, unsigned long long *out) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = now - start;
    }
}
