// Memory read bandwidth, shared by the timing programs (ggml-floor, draft-bench): T threads
// each stream their slice of a buffer much larger than the caches, the way a pass reads its
// weights once. One object owns the buffer, so a program can sample it between its passes.
// With AVX2 each thread reads its slice as 4 streams in lockstep, as a 4-row mat-mul tile
// reads its weight rows: a floor must not sit below what a kernel reaches, and on an AVX2
// EPYC one stream per thread read ~20 % slower than the draft's BF16 mat-vec.
#pragma once

#include "clock.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BW_HAVE_AVX2_PATH 1
#endif

namespace bw_detail {

constexpr size_t WORDS = 8;   // 64 bytes: slices start on a cache line

// portable: one stream, independent accumulators keep several loads in flight
inline uint64_t sum_stream(const uint64_t * p, size_t n) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += p[i + 0]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
        a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
    }
    for (; i < n; ++i) {
        a0 += p[i];
    }
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

#ifdef BW_HAVE_AVX2_PATH
// AVX2: 4 streams in lockstep (the slice's quarters), 64 bytes of each per step; on an
// AVX2 EPYC 1.2x the one-stream loop with 2 threads
__attribute__((target("avx2"))) inline uint64_t sum_4_streams_avx2(const uint64_t * p, size_t n) {
    const size_t part = n / 4 / WORDS * WORDS;
    const __m256i * q0 = (const __m256i *) p;
    const __m256i * q1 = (const __m256i *) (p + part);
    const __m256i * q2 = (const __m256i *) (p + 2 * part);
    const __m256i * q3 = (const __m256i *) (p + 3 * part);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (size_t j = 0; j < part / 4; j += 2) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(q0 + j)); b0 = _mm256_add_epi64(b0, _mm256_load_si256(q0 + j + 1));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(q1 + j)); b1 = _mm256_add_epi64(b1, _mm256_load_si256(q1 + j + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(q2 + j)); b2 = _mm256_add_epi64(b2, _mm256_load_si256(q2 + j + 1));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(q3 + j)); b3 = _mm256_add_epi64(b3, _mm256_load_si256(q3 + j + 1));
    }
    const __m256i r = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a0, b0), _mm256_add_epi64(a1, b1)),
                                       _mm256_add_epi64(_mm256_add_epi64(a2, b2), _mm256_add_epi64(a3, b3)));
    alignas(32) uint64_t o[4];
    _mm256_store_si256((__m256i *) o, r);
    return o[0] + o[1] + o[2] + o[3] + sum_stream(p + 4 * part, n - 4 * part);
}
#endif

inline uint64_t sum(const uint64_t * p, size_t n) {
#ifdef BW_HAVE_AVX2_PATH
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) {
        return sum_4_streams_avx2(p, n);
    }
#endif
    return sum_stream(p, n);
}

}  // namespace bw_detail

// Wait (at most max_s) until this process's other threads are idle: a runtime that spins
// after a pass (OpenMP's default wait policy) would otherwise share the cores with the reader.
inline double settle(double max_s = 0.25) {
    const double t0 = now_s();
    while (now_s() - t0 < max_s) {
        const double c0 = cpu_s(), w0 = now_s();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (cpu_s() - c0 < 0.1 * (now_s() - w0)) {
            break;
        }
    }
    return now_s() - t0;
}

class read_bandwidth {
  public:
    explicit read_bandwidth(size_t bytes) : n(bytes / sizeof(uint64_t)) {
        buf = (uint64_t *) std::aligned_alloc(4096, n * sizeof(uint64_t));
        if (!buf) {
            throw std::runtime_error("cannot allocate the " + std::to_string(bytes >> 20) + " MiB bandwidth buffer");
        }
        for (size_t i = 0; i < n; ++i) {
            buf[i] = i * 0x9E3779B97F4A7C15ull;   // touch every page, non-zero data
            expected += buf[i];
        }
    }
    ~read_bandwidth() { std::free(buf); }
    read_bandwidth(const read_bandwidth &) = delete;
    read_bandwidth & operator=(const read_bandwidth &) = delete;

    size_t bytes() const { return n * sizeof(uint64_t); }

    // one pass over the whole buffer with `threads` threads: GB/s, and the process CPU time
    // over it / (wall x threads) in *cpu_share (well below 1: other processes had the cores)
    double pass(int threads, double * cpu_share = nullptr) {
        std::vector<std::thread> pool;
        std::atomic<uint64_t> total{0};
        const double t0 = now_s(), c0 = cpu_s();
        for (int t = 0; t < threads; ++t) {
            pool.emplace_back([this, t, threads, &total]() {
                const size_t b = slice_start(t, threads), e = slice_start(t + 1, threads);
                total += bw_detail::sum(buf + b, e - b);
            });
        }
        for (auto & th : pool) {
            th.join();
        }
        const double wall = now_s() - t0;
        if (total.load() != expected) {
            // every word read exactly once, or the figure is not a bandwidth
            throw std::runtime_error("the bandwidth reader's sum is wrong: it did not read the whole buffer");
        }
        if (cpu_share) {
            *cpu_share = (cpu_s() - c0) / (wall * threads);
        }
        return (double) bytes() / wall / 1e9;
    }

  private:
    size_t slice_start(int t, int threads) const {
        return t == threads ? n : n * t / threads / bw_detail::WORDS * bw_detail::WORDS;
    }

    size_t n;
    uint64_t * buf = nullptr;
    uint64_t expected = 0;
};
