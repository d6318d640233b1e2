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

#include "dump.h"
#include "scaffold.h"

#include <algorithm>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

static const char * usage =
        "usage: target-features --target T.gguf (--layers 3,24,... | --draft D.gguf) --tokens 1,2,3|ids.npy --out DIR\n"
        "                       [--dump tensor-name,...] [--threads N] [--verbose]\n"
        "  --layers: llama.cpp layer indices whose INPUT is dumped (dflash.target_layers convention)\n";

static int run(int argc, char ** argv) {
    std::string target, draft, tokens, layers, out, dump, prompt;
    int32_t n_generate = 0;
    int32_t threads = 2;
    parse_flags(argc, argv, {
        {"--target", target}, {"--draft", draft}, {"--tokens", tokens}, {"--layers", layers}, {"--out", out},
        {"--threads", threads}, {"--dump", dump}, {"--prompt", prompt}, {"--generate", n_generate},
        {"--verbose", g_verbose},
    }, usage, /*terse =*/ true);
    if (target.empty() || (tokens.empty() == prompt.empty()) || out.empty() || (layers.empty() && draft.empty())) {
        die("--target, one of --tokens/--prompt, --out and one of --layers/--draft are required");
    }
    llama_session session;

    std::vector<llama_token> ids = read_tokens(tokens);
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;

    std::vector<int32_t> lids;
    if (!layers.empty()) {
        lids = parse_ids(layers);
    } else {
        llama_model * model_dft = load_model(draft, mparams, "cannot load draft ");
        const int32_t * p = llama_model_target_layer_ids(model_dft);
        lids.assign(p, p + llama_model_target_layer_ids_n(model_dft));
        llama_model_free(model_dft);
    }

    llama_model * model = session.keep(load_model(target, mparams, "cannot load target "));
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

    llama_context_params cp = context_params((uint32_t) (n_tok + n_generate + 64), (uint32_t) n_tok, threads);
    dump_state dumps;
    dumps.watch(dump, cp);
    llama_context * ctx = session.keep(new_context(model, cp, "cannot create the target context"));
    for (int32_t l : lids) {
        llama_set_embeddings_layer_inp(ctx, (uint32_t) l, true);
    }

    llama_batch_ext * batch = session.keep(llama_batch_ext_init(ctx));
    for (int32_t i = 0; i < n_tok; ++i) {
        int32_t idx = 0;
        if (!add_token(batch, ids[i], i, true, &idx)) {
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
        if (!add_token(batch, next, n_tok + g, true)) {
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
    return 0;
}

int main(int argc, char ** argv) {
    return run_main("target-features", run, argc, argv);
}
