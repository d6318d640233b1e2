// target-features: decode a prompt on the (patched) target and write the hidden states it
// hands a DFlash/DSpark draft, i.e. the INPUTS of the draft's target layers
// (llama_set_embeddings_layer_inp / llama_get_embeddings_layer_inp, the same calls
// common/speculative.cpp makes).
//
// Outputs (in --out):
//   features.npy  f4 [N, L * n_embd]  per token, the L layer inputs concatenated in --layers order
//                                     (exactly the feature rows the draft's context injection takes)
//   logits.npy    f4 [N, V]           the target's logits for every prompt token
//   dump-NAME.npy f4 [N, ne0]         with --dump NAME,...: graph tensors by name (the eval-callback
//                                     mechanism of examples/eval-callback), e.g. kda_out-0, ffn_out-0,
//                                     for an independent recomputation of the layer inputs
//   generated.npy i4 [G]               with --generate G: the greedy continuation (target alone)
//   prompt.npy    i4 [N]               the prompt ids (with --prompt: as the target's vocab tokenizes it)
//   meta.json
#include "llama.h"
#include "llama-ext.h"
#include "ggml.h"
#include "ggml-backend.h"

#include "diag.h"
#include "dump.h"
#include "npy.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

static std::vector<int32_t> parse_list(const std::string & s) {
    std::vector<int32_t> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        v.push_back((int32_t) std::stol(item));
    }
    return v;
}

static int run(int argc, char ** argv) {
    std::string target, draft, tokens, layers, out, dump, prompt;
    int32_t n_generate = 0;
    int32_t threads = 2;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) {
                die("missing value for " + k);
            }
            return argv[++i];
        };
        if      (k == "--target")  target = val();
        else if (k == "--draft")   draft = val();
        else if (k == "--tokens")  tokens = val();
        else if (k == "--layers")  layers = val();
        else if (k == "--out")     out = val();
        else if (k == "--threads") threads = std::stoi(val());
        else if (k == "--dump")    dump = val();
        else if (k == "--prompt")  prompt = val();
        else if (k == "--generate") n_generate = std::stoi(val());
        else if (k == "--verbose") g_verbose = true;
        else {
            std::fprintf(stderr,
                "usage: target-features --target T.gguf (--layers 3,24,... | --draft D.gguf) --tokens 1,2,3|ids.npy --out DIR\n"
                "                       [--dump tensor-name,...] [--threads N] [--verbose]\n"
                "  --layers: llama.cpp layer indices whose INPUT is dumped (dflash.target_layers convention)\n");
            return k == "-h" || k == "--help" ? 0 : 1;
        }
    }
    if (target.empty() || (tokens.empty() == prompt.empty()) || out.empty() || (layers.empty() && draft.empty())) {
        die("--target, one of --tokens/--prompt, --out and one of --layers/--draft are required");
    }
    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    std::vector<llama_token> ids;
    if (tokens.size() > 4 && tokens.substr(tokens.size() - 4) == ".npy") {
        npy_array a = npy_load(tokens);
        for (int64_t i = 0; i < a.size(); ++i) {
            ids.push_back(a.at<llama_token>(i));
        }
    } else {
        for (int32_t t : parse_list(tokens)) {
            ids.push_back(t);
        }
    }
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;

    std::vector<int32_t> lids;
    if (!layers.empty()) {
        lids = parse_list(layers);
    } else {
        llama_model * model_dft = llama_model_load_from_file(draft.c_str(), mparams);
        if (!model_dft) {
            die("cannot load draft " + draft);
        }
        const int32_t * p = llama_model_target_layer_ids(model_dft);
        lids.assign(p, p + llama_model_target_layer_ids_n(model_dft));
        llama_model_free(model_dft);
    }

    llama_model * model = llama_model_load_from_file(target.c_str(), mparams);
    if (!model) {
        die("cannot load target " + target);
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    if (!prompt.empty()) {
        // the way llama-simple tokenizes its prompt
        const int32_t n = -llama_tokenize(vocab, prompt.c_str(), (int32_t) prompt.size(), nullptr, 0, true, true);
        ids.resize(n);
        if (llama_tokenize(vocab, prompt.c_str(), (int32_t) prompt.size(), ids.data(), n, true, true) < 0) {
            die("cannot tokenize the prompt");
        }
    }
    const int32_t n_tok = (int32_t) ids.size();
    if (n_tok == 0) {
        die("the prompt is empty");
    }
    const int32_t n_embd  = llama_model_n_embd(model);
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int32_t n_layer = llama_model_n_layer(model);
    for (int32_t l : lids) {
        if (l < 0 || l >= n_layer) {
            die("layer " + std::to_string(l) + " out of range [0, " + std::to_string(n_layer) + ")");
        }
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx     = (uint32_t) (n_tok + n_generate + 64);
    cp.n_batch   = (uint32_t) n_tok;
    cp.n_ubatch  = (uint32_t) n_tok;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    dump_state dumps;
    for (const auto & name : split_names(dump)) {
        dumps.names.insert(name);
    }
    if (!dumps.names.empty()) {
        cp.cb_eval           = dump_cb;
        cp.cb_eval_user_data = &dumps;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("cannot create the target context");
    }
    for (int32_t l : lids) {
        llama_set_embeddings_layer_inp(ctx, (uint32_t) l, true);
    }

    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    for (int32_t i = 0; i < n_tok; ++i) {
        const llama_pos p = i;
        const int32_t idx = llama_batch_ext_add_token(batch, 0, ids[i]);
        if (idx < 0 || !llama_batch_ext_set_pos(batch, idx, &p) || !llama_batch_ext_set_output_logits(batch, idx, true)) {
            die("cannot add token " + std::to_string(ids[i]) + " (rc " + std::to_string(idx) + ")");
        }
    }
    const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
    if (rc != 0) {
        die("target decode failed, llama_process rc = " + std::to_string(rc));
    }
    dumps.active = false;

    const size_t width = lids.size() * (size_t) n_embd;
    std::vector<float> feats((size_t) n_tok * width);
    for (size_t k = 0; k < lids.size(); ++k) {
        const float * src = llama_get_embeddings_layer_inp(ctx, (uint32_t) lids[k]);
        if (!src) {
            die("layer " + std::to_string(lids[k]) + " input was not extracted");
        }
        for (int32_t i = 0; i < n_tok; ++i) {
            std::memcpy(feats.data() + (size_t) i * width + k * n_embd, src + (size_t) i * n_embd, sizeof(float) * n_embd);
        }
    }
    std::vector<float> logits((size_t) n_tok * n_vocab);
    for (int32_t i = 0; i < n_tok; ++i) {
        const float * lg = llama_get_logits_ith(ctx, i);
        if (!lg) {
            die("no logits for token " + std::to_string(i));
        }
        std::memcpy(logits.data() + (size_t) i * n_vocab, lg, sizeof(float) * n_vocab);
    }

    std::filesystem::create_directories(out);
    npy_save(out + "/features.npy", "<f4", {n_tok, (int64_t) width}, feats.data(), feats.size() * sizeof(float));
    npy_save(out + "/logits.npy", "<f4", {n_tok, n_vocab}, logits.data(), logits.size() * sizeof(float));
    // greedy continuation, one token at a time (after the features were read)
    std::vector<int32_t> generated;
    llama_token next = (llama_token) (std::max_element(logits.end() - n_vocab, logits.end()) - (logits.end() - n_vocab));
    for (int32_t g = 0; g < n_generate; ++g) {
        generated.push_back(next);
        if (llama_vocab_is_eog(vocab, next)) {
            break;
        }
        llama_batch_ext_clear(batch);
        const llama_pos p = n_tok + g;
        const int32_t idx = llama_batch_ext_add_token(batch, 0, next);
        if (idx < 0 || !llama_batch_ext_set_pos(batch, idx, &p) || !llama_batch_ext_set_output_logits(batch, idx, true)) {
            die("cannot add a generated token");
        }
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) != 0) {
            die("generation decode failed");
        }
        const float * lg = llama_get_logits_ith(ctx, 0);
        next = (llama_token) (std::max_element(lg, lg + n_vocab) - lg);
    }
    std::vector<int32_t> prompt_ids(ids.begin(), ids.end());
    npy_save(out + "/prompt.npy", "<i4", {(int64_t) prompt_ids.size()}, prompt_ids.data(), prompt_ids.size() * sizeof(int32_t));
    npy_save(out + "/generated.npy", "<i4", {(int64_t) generated.size()}, generated.data(), generated.size() * sizeof(int32_t));

    dumps.save(out);
    std::ofstream meta(out + "/meta.json");
    meta << "{\n  \"n_tokens\": " << n_tok << ",\n  \"n_embd\": " << n_embd << ",\n  \"n_layer\": " << n_layer
         << ",\n  \"layers\": [";
    for (size_t k = 0; k < lids.size(); ++k) {
        meta << (k ? ", " : "") << lids[k];
    }
    meta << "]\n}\n";
    std::ofstream(out + "/llama.log") << g_log;

    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}

int main(int argc, char ** argv) {
    g_prog = "target-features";
    try {
        return run(argc, argv);
    } catch (const std::exception & err) {
        die(err.what());
    }
}
