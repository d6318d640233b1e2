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

#include "scaffold.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

static const char * usage =
        "usage: model-logits --model M.gguf --tokens 1,2,3 --out DIR [--pos0 P] [--n-out N]\n"
        "                    [--devices CUDA0] [--flash-attn on|off] [--cache-type f16|f32|bf16|q8_0]\n"
        "                    [--threads N] [--verbose]\n";

static int run(int argc, char ** argv) {
    std::string model_path, tokens, out, devices, flash_attn = "off", cache_type = "f16";
    int32_t pos0 = 0, n_out = 1, threads = 2;
    parse_flags(argc, argv, {
        {"--model", model_path}, {"--tokens", tokens}, {"--out", out}, {"--pos0", pos0}, {"--n-out", n_out},
        {"--devices", devices}, {"--flash-attn", flash_attn}, {"--cache-type", cache_type}, {"--threads", threads},
        {"--verbose", g_verbose},
    }, usage, /*terse =*/ true);
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
    llama_session session;

    const std::vector<ggml_backend_dev_t> devs = parse_devices(devices);
    llama_model * model = session.keep(load_model(model_path, placed_params(devs), "cannot load "));
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_context_params cp = context_params((uint32_t) (n_tok + 256), (uint32_t) n_tok, threads);
    set_attention(cp, flash_attn, cache_type);
    llama_context * ctx = session.keep(new_context(model, cp, "cannot create the context (cache " + cache_type +
                                                              ", flash attention " + flash_attn + ")"));
    llama_batch_ext * batch = session.keep(llama_batch_ext_init(ctx));
    for (int32_t i = 0; i < n_tok; ++i) {
        int32_t idx = 0;
        if (!add_token(batch, ids[i], pos0 + i, i >= n_tok - n_out, &idx)) {
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
    return 0;
}

int main(int argc, char ** argv) {
    return run_main("model-logits", run, argc, argv);
}
