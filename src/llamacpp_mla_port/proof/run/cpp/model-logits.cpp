// model-logits: decode a token sequence with a plain model (one ubatch, from position --pos0)
// and write the logits of its last --n-out tokens: the like-with-like side of the device
// check (a deepseek2 model with the draft's MLA geometry, same cache type and attention path,
// on the CPU and on a GPU).
//
// Outputs (in --out): logits.npy f4 [n_out, n_vocab], meta.json, llama.log (llama.cpp's log;
// with GGML_SCHED_DEBUG=2 the scheduler's splits).
#include "llama.h"
#include "llama-ext.h"
#include "ggml.h"
#include "ggml-backend.h"

#include "devices.h"
#include "diag.h"
#include "npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

static ggml_type cache_type_of(const std::string & s) {
    if (s == "f16")  return GGML_TYPE_F16;
    if (s == "f32")  return GGML_TYPE_F32;
    if (s == "bf16") return GGML_TYPE_BF16;
    if (s == "q8_0") return GGML_TYPE_Q8_0;
    die("unsupported --cache-type " + s + " (f16, f32, bf16, q8_0)");
}

static int run(int argc, char ** argv) {
    std::string model_path, tokens, out, devices, flash_attn = "off", cache_type = "f16";
    int32_t pos0 = 0, n_out = 1, threads = 2;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) {
                die("missing value for " + k);
            }
            return argv[++i];
        };
        if      (k == "--model")      model_path = val();
        else if (k == "--tokens")     tokens = val();
        else if (k == "--out")        out = val();
        else if (k == "--pos0")       pos0 = std::stoi(val());
        else if (k == "--n-out")      n_out = std::stoi(val());
        else if (k == "--devices")    devices = val();
        else if (k == "--flash-attn") flash_attn = val();
        else if (k == "--cache-type") cache_type = val();
        else if (k == "--threads")    threads = std::stoi(val());
        else if (k == "--verbose")    g_verbose = true;
        else {
            std::fprintf(stderr,
                "usage: model-logits --model M.gguf --tokens 1,2,3 --out DIR [--pos0 P] [--n-out N]\n"
                "                    [--devices CUDA0] [--flash-attn on|off] [--cache-type f16|f32|bf16|q8_0]\n"
                "                    [--threads N] [--verbose]\n");
            return k == "-h" || k == "--help" ? 0 : 1;
        }
    }
    if (model_path.empty() || tokens.empty() || out.empty()) {
        die("--model, --tokens and --out are required");
    }
    std::vector<llama_token> ids;
    for (const std::string & t : split_list(tokens)) {
        ids.push_back((llama_token) std::stol(t));
    }
    const int32_t n_tok = (int32_t) ids.size();
    if (n_out < 1 || n_out > n_tok || pos0 < 0) {
        die("need 1 <= --n-out <= the number of tokens and --pos0 >= 0");
    }
    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    const std::vector<ggml_backend_dev_t> devs = parse_devices(devices);
    llama_model * model = llama_model_load_from_file(model_path.c_str(), placed_params(devs));
    if (!model) {
        die("cannot load " + model_path);
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = (uint32_t) (n_tok + 256);
    cp.n_batch         = (uint32_t) n_tok;
    cp.n_ubatch        = (uint32_t) n_tok;
    cp.n_seq_max       = 1;
    cp.n_threads       = cp.n_threads_batch = threads;
    cp.flash_attn_type = flash_attn == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k          = cache_type_of(cache_type);
    cp.type_v          = cp.type_k;    // MLA requires equal K and V cache types
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("cannot create the context (cache " + cache_type + ", flash attention " + flash_attn + ")");
    }
    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    for (int32_t i = 0; i < n_tok; ++i) {
        const llama_pos p = pos0 + i;
        const int32_t idx = llama_batch_ext_add_token(batch, 0, ids[i]);
        if (idx < 0 || !llama_batch_ext_set_pos(batch, idx, &p) ||
            (i >= n_tok - n_out && !llama_batch_ext_set_output_logits(batch, idx, true))) {
            die("cannot add token " + std::to_string(ids[i]) + " (rc " + std::to_string(idx) + ")");
        }
    }
    const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
    if (rc != 0) {
        die("decode failed, llama_process rc = " + std::to_string(rc));
    }
    std::vector<float> logits((size_t) n_out * n_vocab);
    for (int32_t j = 0; j < n_out; ++j) {
        const float * lg = llama_get_logits_ith(ctx, n_tok - n_out + j);
        if (!lg) {
            die("no logits for token " + std::to_string(n_tok - n_out + j));
        }
        std::memcpy(logits.data() + (size_t) j * n_vocab, lg, sizeof(float) * n_vocab);
    }
    std::filesystem::create_directories(out);
    npy_save(out + "/logits.npy", "<f4", {n_out, n_vocab}, logits.data(), logits.size() * sizeof(float));
    std::ofstream(out + "/meta.json") << "{\n  \"n_tokens\": " << n_tok << ",\n  \"n_out\": " << n_out
        << ",\n  \"pos0\": " << pos0 << ",\n  \"n_vocab\": " << n_vocab << ",\n  \"devices\": \"" << devices
        << "\",\n  \"flash_attn\": \"" << flash_attn << "\",\n  \"cache_type\": \"" << cache_type << "\"\n}\n";
    std::ofstream(out + "/llama.log") << g_log;

    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

int main(int argc, char ** argv) {
    g_prog = "model-logits";
    try {
        return run(argc, argv);
    } catch (const std::exception & err) {
        die(err.what());
    }
}
