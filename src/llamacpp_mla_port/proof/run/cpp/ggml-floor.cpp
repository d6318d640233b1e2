// ggml-floor: what this machine and this ggml build can do at best, for the benchmark's floors.
//   * memory read bandwidth with T threads: each thread streams its slice of a buffer much larger
//     than the caches (bandwidth.h), --bw-passes times and once more before each product: the
//     floor takes the best; the weights of a draft pass are read once;
//   * the GEMM rate ggml itself reaches: GGML_OP_MUL_MAT with a weight of the given type and
//     shape [K, M] times F32 activations [K, N], computed by the CPU backend with T threads,
//     the weight placed in the buffer type llama.cpp's loader would pick (an "extra" CPU
//     buffer type such as AMX or CPU_REPACK when it supports the op, else plain CPU).
//
// usage: ggml-floor --threads T --out OUT.json [--bw-mib 2048] [--bw-passes 5]
//                   [--gemm TYPE:K:M:N,...] [--repeats 3] [--no-extra-bufts]
// Every timing comes with the process CPU time over it: wall x threads well above it means
// other processes had the cores, and the figure is not the machine's.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

#include "bandwidth.h"
#include "clock.h"
#include "scaffold.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>


// ---------------------------------------------------------------------------------------
// bandwidth (bandwidth.h: the same reader draft-bench samples between its passes)

static void bandwidth(read_bandwidth & reader, int threads, int passes, std::vector<double> & gbps,
                      std::vector<double> * cpu_share) {
    for (int p = 0; p < passes; ++p) {
        settle();      // the last product's OpenMP threads may still spin
        double share = 0.0;
        gbps.push_back(reader.pass(threads, &share));
        if (cpu_share) {
            cpu_share->push_back(share);
        }
    }
}

// ---------------------------------------------------------------------------------------
// GEMM

struct gemm_spec {
    std::string type;
    int64_t k, m, n;
};

struct gemm_result {
    gemm_spec spec;
    std::string buft;
    std::vector<double> seconds;
    std::vector<double> cpu_seconds;
};

static ggml_type parse_type(const std::string & s) {
    if (s == "f32")  return GGML_TYPE_F32;
    if (s == "f16")  return GGML_TYPE_F16;
    if (s == "bf16") return GGML_TYPE_BF16;
    if (s == "q8_0") return GGML_TYPE_Q8_0;
    if (s == "q4_0") return GGML_TYPE_Q4_0;
    die("unsupported weight type " + s);
}

static std::vector<gemm_spec> parse_gemm(const std::string & s) {
    std::vector<gemm_spec> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        std::stringstream is(item);
        std::string type, k, m, n;
        if (!std::getline(is, type, ':') || !std::getline(is, k, ':') || !std::getline(is, m, ':') || !std::getline(is, n, ':')) {
            die("--gemm entries are TYPE:K:M:N, got " + item);
        }
        v.push_back({type, std::stoll(k), std::stoll(m), std::stoll(n)});
    }
    return v;
}

static void fill_uniform(std::vector<float> & v, uint64_t seed, float scale) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto & f : v) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        f = scale * ((float) (x >> 40) / (float) (1ull << 24) * 2.0f - 1.0f);
    }
}

static gemm_result run_gemm(ggml_backend_t backend, ggml_backend_dev_t dev, const gemm_spec & g, int repeats,
                            bool extra_bufts) {
    const ggml_type wtype = parse_type(g.type);
    if (g.k % ggml_blck_size(wtype) != 0) {
        die("K = " + std::to_string(g.k) + " is not a multiple of the " + g.type + " block size");
    }
    ggml_init_params ip = { 8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx_w = ggml_init(ip);
    ggml_context * ctx_x = ggml_init(ip);
    ggml_tensor * w = ggml_new_tensor_2d(ctx_w, wtype, g.k, g.m);
    ggml_tensor * x = ggml_new_tensor_2d(ctx_x, GGML_TYPE_F32, g.k, g.n);
    ggml_tensor * y = ggml_mul_mat(ctx_x, w, x);

    // the loader's choice: the first extra buffer type whose device supports this op with it
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (get_extra && extra_bufts) {
        for (ggml_backend_buffer_type_t * e = get_extra(dev); e && *e; ++e) {
            ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(*e, 0);
            w->buffer = dummy;
            const bool ok = ggml_backend_dev_supports_op(dev, y);
            w->buffer = nullptr;
            ggml_backend_buffer_free(dummy);
            if (ok) {
                buft = *e;
                break;
            }
        }
    }
    ggml_backend_buffer_t buf_w = ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, buft);
    ggml_backend_buffer_t buf_x = ggml_backend_alloc_ctx_tensors(ctx_x, backend);
    if (!buf_w || !buf_x) {
        die("cannot allocate the GEMM tensors");
    }
    ggml_backend_buffer_set_usage(buf_w, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    {
        // the weight, row chunk by row chunk: random F32 converted by ggml's own routine
        const int64_t rows_per = std::max<int64_t>(1, (64ll << 20) / (g.k * 4));
        std::vector<float> src;
        std::vector<uint8_t> dst;
        const size_t row_bytes = ggml_row_size(wtype, g.k);
        for (int64_t r0 = 0; r0 < g.m; r0 += rows_per) {
            const int64_t nr = std::min(rows_per, g.m - r0);
            src.resize((size_t) (nr * g.k));
            fill_uniform(src, (uint64_t) r0 + 7, 0.02f);
            dst.resize((size_t) nr * row_bytes);
            ggml_quantize_chunk(wtype, src.data(), dst.data(), 0, nr, g.k, nullptr);
            ggml_backend_tensor_set(w, dst.data(), (size_t) r0 * row_bytes, dst.size());
        }
        std::vector<float> xs((size_t) (g.k * g.n));
        fill_uniform(xs, 99, 1.0f);
        ggml_backend_tensor_set(x, xs.data(), 0, xs.size() * sizeof(float));
    }

    ggml_cgraph * gf = ggml_new_graph(ctx_x);
    ggml_build_forward_expand(gf, y);
    gemm_result res{g, ggml_backend_buft_name(buft), {}, {}};
    for (int r = 0; r <= repeats; ++r) {
        const double t0 = now_s(), c0 = cpu_s();
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            die("graph compute failed");
        }
        if (r > 0) {
            res.seconds.push_back(now_s() - t0);
            res.cpu_seconds.push_back(cpu_s() - c0);
        }
    }
    ggml_backend_buffer_free(buf_w);
    ggml_backend_buffer_free(buf_x);
    ggml_free(ctx_w);
    ggml_free(ctx_x);
    return res;
}

static int run(int argc, char ** argv) {
    int threads = 2, passes = 5, repeats = 3;
    size_t bw_mib = 2048;
    bool extra_bufts = true;
    std::string out, gemm;
    parse_flags(argc, argv, {
        {"--threads", threads}, {"--out", out}, {"--bw-mib", bw_mib}, {"--bw-passes", passes}, {"--gemm", gemm},
        {"--repeats", repeats}, {"--no-extra-bufts", [&] { extra_bufts = false; }},
    }, /*usage =*/ nullptr);
    if (out.empty() || threads < 1) {
        die("--out is required and --threads must be >= 1");
    }

    ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) {
        die("no CPU backend device");
    }
    ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
    auto set_threads = (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(
            ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads");
    if (!set_threads) {
        die("the CPU backend exposes no ggml_backend_set_n_threads");
    }
    set_threads(backend, threads);

    auto reader = std::make_unique<read_bandwidth>(bw_mib << 20);
    std::vector<double> bw, bw_cpu, bw1;
    bandwidth(*reader, threads, passes, bw, &bw_cpu);
    if (threads > 1) {
        bandwidth(*reader, 1, std::max(2, passes / 2), bw1, nullptr);
    } else {
        bw1 = bw;
    }
    std::vector<gemm_result> gemms;
    for (const auto & g : parse_gemm(gemm)) {
        // one more read before each product: the machine's bandwidth moves, and the floor takes the best
        bandwidth(*reader, threads, 1, bw, &bw_cpu);
        gemms.push_back(run_gemm(backend, dev, g, repeats, extra_bufts));
        const auto & r = gemms.back();
        std::fprintf(stderr, "ggml-floor: %s %lldx%lld x %lld on %s: %.1f GFLOP/s\n", g.type.c_str(), (long long) g.k,
                     (long long) g.m, (long long) g.n, r.buft.c_str(),
                     2.0 * g.k * g.m * g.n / *std::min_element(r.seconds.begin(), r.seconds.end()) / 1e9);
    }

    std::ofstream o(out);
    o << "{\n  \"threads\": " << threads << ",\n  \"bandwidth\": {\"bytes\": " << (bw_mib << 20)
      << ", \"gbps\": " << json_samples(bw) << ", \"cpu_share\": " << json_samples(bw_cpu)
      << ", \"gbps_1_thread\": " << json_samples(bw1) << "},\n  \"extra_bufts\": " << (extra_bufts ? "true" : "false")
      << ",\n  \"gemm\": [";
    for (size_t i = 0; i < gemms.size(); ++i) {
        const auto & r = gemms[i];
        o << (i ? ",\n    " : "\n    ") << "{\"type\": \"" << r.spec.type << "\", \"k\": " << r.spec.k << ", \"m\": " << r.spec.m
          << ", \"n\": " << r.spec.n << ", \"buft\": \"" << r.buft << "\", \"seconds\": " << json_samples(r.seconds)
          << ", \"cpu_seconds\": " << json_samples(r.cpu_seconds) << "}";
    }
    o << "]\n}\n";
    ggml_backend_free(backend);
    return 0;
}

int main(int argc, char ** argv) {
    return run_main("ggml-floor", run, argc, argv);
}
