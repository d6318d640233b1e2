// mulmat-check: GGML_OP_MUL_MAT on the CPU backend against a float64 product, for one weight
// type and shape. The reference multiplies the weights as stored (BF16, F16, or Q8_0
// dequantized: exact in float64) by the activations converted the way ggml's mul_mat converts them (the CPU
// from_float of the weight type's vec_dot_type, read back exactly), so the only error left is
// the kernel's own rounding. Bound per output: gamma_n * sum_k |w_k * x_k|, gamma_n =
// n*u/(1 - n*u), u = 2^-24, n the most roundings one product meets on its way to the output:
//   Q8_0 in the block order of ggml_vec_dot_q8_0_q8_0 and tinyBLAS_Q0_AVX (AVX2, --bound
//     kernel): K/32 FMAs per lane + 3 (8-lane sum); the per-block integer sums and the
//     fp16 x fp16 scale products are exact in F32
//   any other order (--bound any): K + 1 (one rounding per product and per addition, one store)
// For Q8_0 it also recomputes each output in that block order (fmaf, F32) and counts outputs
// that differ bit for bit ("order_mismatch"): 0 means every output was computed, in that order.
// With one head it multiplies each column again alone (N = 1) and counts outputs that differ
// bit for bit from the N-column product ("n1_mismatch"; -1 with heads): 0 means a column's
// result does not depend on the column count.
//
// usage: mulmat-check --type bf16|f16|q8_0 --k K --m M --n N [--heads H] [--threads T] [--seed S]
//                     [--bound kernel|any]  (kernel: Q8_0's block order; any: K + 1)
//                     [--perturb]   (the reference uses a weight row with 32 negated values:
//                                    the control, its max_ratio must exceed 1)
//                     [--perturb-n1]  (the N = 1 products use a weight row with one bit flipped:
//                                    the control of n1_mismatch, which must then be > 0)
// prints one JSON object.
#include "ggml.h"
#include "ggml-cpu.h"

#include "diag.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

struct rng {
    uint64_t s;
    double uniform() {  // [0, 1)
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        return (double) (s >> 11) * (1.0 / 9007199254740992.0);
    }
    float normalish() {  // mean 0, variance 1, a few large values
        double a = 0;
        for (int i = 0; i < 4; ++i) {
            a += uniform();
        }
        return (float) ((a - 2.0) * 1.7320508);
    }
};

static float hsum8(const float a[8]) {
    const float h0 = a[4] + a[0], h1 = a[5] + a[1], h2 = a[6] + a[2], h3 = a[7] + a[3];
    return (h0 + h2) + (h1 + h3);
}

int main(int argc, char ** argv) {
    g_prog = "mulmat-check";
    std::string type_s = "bf16";
    int64_t K = 0, M = 0, N = 0, H = 1;
    int threads = 2;
    uint64_t seed = 1;
    bool perturb = false;
    bool kernel_bound = false;
    bool perturb_n1 = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) die("missing value after " + a);
            return argv[++i];
        };
        if      (a == "--type")    type_s = val();
        else if (a == "--k")       K = std::atoll(val().c_str());
        else if (a == "--m")       M = std::atoll(val().c_str());
        else if (a == "--n")       N = std::atoll(val().c_str());
        else if (a == "--heads")   H = std::atoll(val().c_str());
        else if (a == "--threads") threads = std::atoi(val().c_str());
        else if (a == "--seed")    seed = std::strtoull(val().c_str(), nullptr, 10);
        else if (a == "--perturb") perturb = true;
        else if (a == "--perturb-n1") perturb_n1 = true;
        else if (a == "--bound")   kernel_bound = val() == "kernel";
        else die("unknown argument " + a);
    }
    const ggml_type type = type_s == "bf16" ? GGML_TYPE_BF16 : type_s == "f16" ? GGML_TYPE_F16
                         : type_s == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_COUNT;
    if (type == GGML_TYPE_COUNT) die("--type is bf16, f16 or q8_0");
    if (K <= 0 || M <= 0 || N <= 0 || H <= 0) die("--k, --m, --n (and --heads) must be positive");
    if (type == GGML_TYPE_Q8_0 && K % 32 != 0) die("Q8_0 needs K a multiple of 32");
    if (type != GGML_TYPE_Q8_0 && kernel_bound) die("--bound kernel is Q8_0's block order");

    ggml_cpu_init();
    rng r{seed * 0x9E3779B97F4A7C15ULL + 7};

    // weights: F32 values -> the weight type (the stored bytes), and back to F32 exactly
    std::vector<float> w32((size_t) (K * M * H));
    for (auto & v : w32) v = r.normalish();
    const size_t wrow = ggml_row_size(type, K);
    std::vector<uint8_t> wq(wrow * M * H);
    if (type == GGML_TYPE_BF16) {
        ggml_fp32_to_bf16_row(w32.data(), (ggml_bf16_t *) wq.data(), K * M * H);
    } else if (type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(w32.data(), (ggml_fp16_t *) wq.data(), K * M * H);
    } else {
        ggml_quantize_chunk(type, w32.data(), wq.data(), 0, M * H, K, nullptr);
    }
    std::vector<float> wd((size_t) (K * M * H));
    ggml_get_type_traits(type)->to_float(wq.data(), wd.data(), K * M * H);

    // activations, and what mul_mat multiplies them as (vec_dot_type via the CPU from_float)
    std::vector<float> x((size_t) (K * N * H));
    for (auto & v : x) v = r.normalish();
    const ggml_type vdt = ggml_get_type_traits_cpu(type)->vec_dot_type;
    std::vector<uint8_t> xq(ggml_row_size(vdt, K) * N * H);
    std::vector<float> xd((size_t) (K * N * H));
    for (int64_t c = 0; c < N * H; ++c) {
        ggml_get_type_traits_cpu(vdt)->from_float(x.data() + c * K, xq.data() + c * ggml_row_size(vdt, K), K);
        ggml_get_type_traits(vdt)->to_float(xq.data() + c * ggml_row_size(vdt, K), xd.data() + c * K, K);
    }

    // the graph: W [K, M, H] x X [K, N, H]; with H > 1, X is a permuted view of [K, H, N]
    // (the strided per-head activation an MLA graph multiplies k_b and v_b by)
    const size_t mem = 2 * wq.size() + x.size() * sizeof(float) + 2 * (size_t) (M * N * H) * sizeof(float) + 16 * 1024 * 1024;
    ggml_init_params ip = { mem, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * W = ggml_new_tensor_3d(ctx, type, K, M, H);
    std::memcpy(W->data, wq.data(), wq.size());
    ggml_tensor * X;
    if (H == 1) {
        X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, N);
        std::memcpy(X->data, x.data(), x.size() * sizeof(float));
    } else {
        ggml_tensor * X0 = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, K, H, N);
        float * p = (float *) X0->data;
        for (int64_t h = 0; h < H; ++h)
            for (int64_t n = 0; n < N; ++n)
                std::memcpy(p + (n * H + h) * K, x.data() + (h * N + n) * K, K * sizeof(float));
        X = ggml_permute(ctx, X0, 0, 2, 1, 3);
    }
    ggml_tensor * Y = ggml_mul_mat(ctx, W, X);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, Y);
    if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) die("graph compute failed");

    // each column alone (N = 1), from the same weights (the control: one bit of one row flipped)
    int64_t n1_mismatch = -1;
    if (H == 1) {
        ggml_tensor * W1 = W;
        if (perturb_n1) {
            W1 = ggml_dup_tensor(ctx, W);
            std::memcpy(W1->data, wq.data(), wq.size());
            ((uint8_t *) W1->data)[(size_t) (M / 2) * wrow] ^= 1;  // a low mantissa bit (Q8_0: of the scale)
        }
        ggml_cgraph * g1 = ggml_new_graph(ctx);
        std::vector<ggml_tensor *> cols;
        for (int64_t n = 0; n < N; ++n) {
            cols.push_back(ggml_mul_mat(ctx, W1, ggml_view_2d(ctx, X, K, 1, X->nb[1], n * X->nb[1])));
            ggml_build_forward_expand(g1, cols.back());
        }
        if (ggml_graph_compute_with_ctx(ctx, g1, threads) != GGML_STATUS_SUCCESS) die("graph compute failed");
        n1_mismatch = 0;
        for (int64_t n = 0; n < N; ++n) {
            for (int64_t m = 0; m < M; ++m) {
                const float a = *(const float *) ((const char *) Y->data + m * Y->nb[0] + n * Y->nb[1]);
                const float b = ((const float *) cols[n]->data)[m];
                if (std::memcmp(&a, &b, sizeof(float)) != 0) ++n1_mismatch;
            }
        }
    }

    if (perturb) {  // the control: the reference's weights differ from the ones multiplied
        const int64_t row = M / 2;
        for (int64_t k = 0; k < std::min<int64_t>(32, K); ++k) wd[(size_t) (row * K + k)] = -wd[(size_t) (row * K + k)];
    }

    int64_t n_round = K + 1;
    if (kernel_bound) {
        n_round = K / 32 + 3;
    }
    const double u = std::ldexp(1.0, -24);
    const double gamma = n_round * u / (1.0 - n_round * u);

    double max_ratio = 0, max_abs = 0, max_rel = 0;
    int64_t mismatch = 0;
    for (int64_t h = 0; h < H; ++h) {
        for (int64_t n = 0; n < N; ++n) {
            const float * xr = xd.data() + (h * N + n) * K;
            const uint8_t * xqr = xq.data() + (h * N + n) * ggml_row_size(vdt, K);
            for (int64_t m = 0; m < M; ++m) {
                const float * wr = wd.data() + (h * M + m) * K;
                double ref = 0, mag = 0;
                for (int64_t k = 0; k < K; ++k) {
                    ref += (double) wr[k] * (double) xr[k];
                    mag += std::fabs((double) wr[k] * (double) xr[k]);
                }
                const float got = *(const float *) ((const char *) Y->data + m * Y->nb[0] + n * Y->nb[1] + h * Y->nb[2]);
                const double err = std::fabs((double) got - ref);
                const double bound = gamma * mag + 1e-300;
                max_ratio = std::max(max_ratio, err / bound);
                max_abs = std::max(max_abs, err);
                max_rel = std::max(max_rel, mag > 0 ? err / mag : 0.0);

                // Q8_0's block order, in F32 (from the unperturbed weights): fp16 scale, 32
                // int8; 8 lanes of 4 products, block by block
                if (type == GGML_TYPE_Q8_0) {
                    const uint8_t * wb = wq.data() + (h * M + m) * wrow;
                    float acc[8] = {0};
                    for (int64_t b = 0; b < K / 32; ++b) {
                        const uint8_t * bw = wb + 34 * b;
                        const uint8_t * bx = xqr + 34 * b;
                        ggml_fp16_t dw, dx;
                        std::memcpy(&dw, bw, 2);
                        std::memcpy(&dx, bx, 2);
                        const float d = ggml_fp16_to_fp32(dw) * ggml_fp16_to_fp32(dx);
                        for (int l = 0; l < 8; ++l) {
                            int32_t s = 0;
                            for (int i = 4 * l; i < 4 * l + 4; ++i) s += (int8_t) bw[2 + i] * (int8_t) bx[2 + i];
                            acc[l] = std::fmaf(d, (float) s, acc[l]);
                        }
                    }
                    const float emu = hsum8(acc);
                    if (std::memcmp(&emu, &got, sizeof(float)) != 0) ++mismatch;
                }
            }
        }
    }
    std::printf("{\"type\": \"%s\", \"k\": %lld, \"m\": %lld, \"n\": %lld, \"heads\": %lld, \"threads\": %d, "
                "\"perturb\": %s, \"n_round\": %lld, \"gamma\": %.6g, \"max_ratio\": %.6g, \"max_abs_err\": %.6g, "
                "\"max_rel_err\": %.6g, \"order_mismatch\": %lld, \"n1_mismatch\": %lld, \"outputs\": %lld}\n",
                type_s.c_str(), (long long) K, (long long) M, (long long) N, (long long) H, threads,
                perturb ? "true" : "false", (long long) n_round, gamma, max_ratio, max_abs, max_rel,
                (long long) mismatch, (long long) n1_mismatch, (long long) (M * N * H));
    ggml_free(ctx);
    return 0;
}
