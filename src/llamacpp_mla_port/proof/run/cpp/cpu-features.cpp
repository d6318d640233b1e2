// cpu-features: what the build's ggml-cpu was compiled for, as one JSON line. ggml_cpu_has_*
// report the library's compile-time features, not the CPU's: a portable build of an AVX2 CPU
// says avx2 0, a native build of an AMX Xeon says amx_int8 1.
#include "ggml-cpu.h"

#include <cstdio>

int main() {
    std::printf("{\"avx2\": %d, \"fma\": %d, \"f16c\": %d, \"avx512\": %d, \"avx512_bf16\": %d, \"amx_int8\": %d}\n",
                ggml_cpu_has_avx2(), ggml_cpu_has_fma(), ggml_cpu_has_f16c(), ggml_cpu_has_avx512(),
                ggml_cpu_has_avx512_bf16(), ggml_cpu_has_amx_int8());
    return 0;
}
