// draft-logits: run a (patched) llama.cpp DFlash/DSpark draft on given target features and
// block token ids, and write what it computes as .npy files.
//
// It drives the draft through the public API the way common/speculative.cpp does:
//   * the draft context gets ctx_other = a context of the TARGET model (token embeddings and
//     lm_head come from there), non-causal attention, nextn embeddings (masked) for the
//     confidence head;
//   * one embd batch of feature rows (taps x target n_embd floats each) at the context
//     positions fills the draft's KV cache (context injection, no outputs);
//   * one token batch [anchor, MASK...] at the following positions, every row an output.
//
// Outputs (in --out):
//   biased_logits.npy  f4 [B, V]  what llama.cpp returns (Markov-biased when the draft has a Markov head)
//   chain.npy          i4 [B]     argmax of each returned row (the in-graph greedy chain)
//   hidden.npy         f4 [B, E]  the draft's final-normed hidden state (llama_get_embeddings_ith)
//   base_logits.npy    f8 [B, V]  hidden x the target's output.weight, in double: llama.cpp does
//                                 not return the unbiased logits when the Markov head runs, so they
//                                 are rebuilt from llama.cpp's own hidden state and the target head
//                                 (--no-base-logits skips them: at real size the head is 4.7 GB as F32)
//   confidence.npy     f4 [B]     sigmoid confidence (nextn output), only with a confidence head
//   dump-NAME.npy      f4 [N, ne0] with --dump NAME,...: graph tensors by name from either decode
//                                 (e.g. Kcur_injected-0, the context's K rows before the cache
//                                 stores them), for a staged comparison (proof/parity.py)
//   meta.json                     sizes and what ran
//
// Placement (default: everything on the CPU): --rpc HOST:PORT,... registers llama.cpp RPC
// servers, --draft-devices / --target-devices put each model (all its layers) on the named
// devices (RPC0, RPC1, ... as llama.cpp names them; CPU), so the features, the injected
// latent rows and the block cross the RPC boundary.
#include "llama.h"
#include "llama-ext.h"
#include "gguf.h"
#include "ggml.h"
#include "ggml-backend.h"

#include "dump.h"
#include "scaffold.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

struct args_t {
    std::string draft, target, features, tokens, out, dump;
    int32_t ctx_pos0   = 0;
    int32_t block_pos0 = -1;
    int32_t threads    = 2;
    float   yarn_attn_factor = -1.0f;   // llama.cpp's default: negative = the model's
    std::string flash_attn = "off";
    std::string cache_type = "f16";
    std::string rpc, draft_devices, target_devices;
    bool base_logits = true;
};

static const char * usage =
        "usage: draft-logits --draft D.gguf --target T.gguf --features F.npy --tokens IDS --out DIR\n"
        "                    [--ctx-pos0 N] [--block-pos0 N] [--flash-attn on|off] [--cache-type f16|f32|bf16|q8_0]\n"
        "                    [--dump tensor-name,...] [--threads N] [--no-base-logits] [--verbose]\n"
        "                    [--yarn-attn-factor F]   (the draft context's, as llama-server's --yarn-attn-factor)\n"
        "                    [--rpc HOST:PORT,...] [--draft-devices DEV,...] [--target-devices DEV,...]\n"
        "  F.npy: [C, taps * target_n_embd] float32/float64 target features for positions ctx-pos0 .. ctx-pos0+C-1\n"
        "  IDS:   comma-separated token ids or an int .npy: the block [anchor, MASK, ...] at block-pos0 (default ctx-pos0+C)\n";

static args_t parse_args(int argc, char ** argv) {
    args_t a;
    parse_flags(argc, argv, {
        {"--draft", a.draft}, {"--target", a.target}, {"--features", a.features}, {"--tokens", a.tokens},
        {"--out", a.out}, {"--ctx-pos0", a.ctx_pos0}, {"--block-pos0", a.block_pos0}, {"--threads", a.threads},
        {"--yarn-attn-factor", a.yarn_attn_factor}, {"--flash-attn", a.flash_attn}, {"--cache-type", a.cache_type},
        {"--rpc", a.rpc}, {"--draft-devices", a.draft_devices}, {"--target-devices", a.target_devices},
        {"--dump", a.dump}, {"--verbose", g_verbose}, {"--no-base-logits", [&] { a.base_logits = false; }},
    }, usage);
    if (a.draft.empty() || a.target.empty() || a.features.empty() || a.tokens.empty() || a.out.empty()) {
        die_usage(usage, "--draft, --target, --features, --tokens and --out are required");
    }
    return a;
}

// as common's --rpc does: each server's devices join the backend registry
static void add_rpc_servers(const std::string & servers) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
    if (!reg) {
        die("--rpc: this llama.cpp build has no RPC backend (configure it with -DGGML_RPC=ON: make build, not RPC=0)");
    }
    using add_server_fn = ggml_backend_reg_t (*)(const char * endpoint);
    auto add_server = (add_server_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server");
    if (!add_server) {
        die("--rpc: the RPC backend has no ggml_backend_rpc_add_server");
    }
    for (const std::string & server : split_list(servers)) {
        ggml_backend_reg_t server_reg = add_server(server.c_str());
        if (!server_reg) {
            die("cannot use RPC server " + server + " (the reason is logged above)");
        }
        ggml_backend_register(server_reg);
    }
}

// One tensor of a GGUF file as float32 rows, read straight from the file (no full load).
static std::vector<float> read_gguf_tensor_f32(const std::string & path, const char * name, int64_t & ne0, int64_t & ne1) {
    gguf_init_params params = { /*no_alloc =*/ true, /*ctx =*/ nullptr };
    gguf_context * g = gguf_init_from_file(path.c_str(), params);
    if (!g) {
        die("cannot read GGUF " + path);
    }
    const int64_t id = gguf_find_tensor(g, name);
    if (id < 0) {
        gguf_free(g);
        die(path + " has no tensor " + name);
    }
    const int64_t * ne = gguf_get_tensor_ne(g, id);
    ne0 = ne[0];
    ne1 = ne[1];
    const ggml_type type = gguf_get_tensor_type(g, id);
    const size_t offset  = gguf_get_data_offset(g) + gguf_get_tensor_offset(g, id);
    const size_t nbytes  = gguf_get_tensor_size(g, id);
    gguf_free(g);

    std::vector<char> raw(nbytes);
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f || std::fseek(f, (long) offset, SEEK_SET) != 0 || std::fread(raw.data(), 1, nbytes, f) != nbytes) {
        if (f) {
            std::fclose(f);
        }
        die(std::string("cannot read tensor ") + name + " from " + path);
    }
    std::fclose(f);

    std::vector<float> out((size_t) (ne0 * ne1));
    if (type == GGML_TYPE_F32) {
        std::memcpy(out.data(), raw.data(), out.size() * sizeof(float));
    } else {
        const auto * traits = ggml_get_type_traits(type);
        if (!traits->to_float) {
            die(std::string("tensor ") + name + " has type " + ggml_type_name(type) + " with no float conversion");
        }
        const size_t row_bytes = ggml_row_size(type, ne0);
        for (int64_t r = 0; r < ne1; ++r) {
            traits->to_float(raw.data() + r * row_bytes, out.data() + r * ne0, ne0);
        }
    }
    return out;
}

static bool gguf_has_tensor(const std::string & path, const char * name) {
    gguf_init_params params = { /*no_alloc =*/ true, /*ctx =*/ nullptr };
    gguf_context * g = gguf_init_from_file(path.c_str(), params);
    if (!g) {
        die("cannot read GGUF " + path);
    }
    const bool has = gguf_find_tensor(g, name) >= 0;
    gguf_free(g);
    return has;
}

static int run(int argc, char ** argv) {
    const args_t args = parse_args(argc, argv);
    llama_session session;

    npy_array feats = npy_load(args.features);
    if (feats.shape.size() != 2) {
        die("--features must be a 2-D array [n_ctx, taps * n_embd]");
    }
    const int64_t n_ctx_rows = feats.shape[0];
    const int64_t width      = feats.shape[1];
    std::vector<float> feat_f32((size_t) feats.size());
    for (int64_t i = 0; i < feats.size(); ++i) {
        feat_f32[i] = feats.at<float>(i);
    }
    const std::vector<llama_token> block = read_tokens(args.tokens);
    const int32_t n_block = (int32_t) block.size();
    if (n_block == 0) {
        die("--tokens is empty");
    }
    const int32_t block_pos0 = args.block_pos0 >= 0 ? args.block_pos0 : args.ctx_pos0 + (int32_t) n_ctx_rows;

    if (!args.rpc.empty()) {
        add_rpc_servers(args.rpc);
    }
    const std::vector<ggml_backend_dev_t> devs_tgt = parse_devices(args.target_devices);
    const std::vector<ggml_backend_dev_t> devs_dft = parse_devices(args.draft_devices);
    llama_model * model_tgt = session.keep(load_model(args.target, placed_params(devs_tgt), "cannot load target "));
    llama_model * model_dft = session.keep(load_model(args.draft, placed_params(devs_dft), "cannot load draft "));
    if (meta_str(model_dft, "general.architecture") != "dflash") {
        die(args.draft + " is not a dflash draft (general.architecture = " + meta_str(model_dft, "general.architecture") + ")");
    }

    const int32_t n_embd_tgt = llama_model_n_embd(model_tgt);
    const int32_t n_embd_dft = llama_model_n_embd(model_dft);
    const int32_t n_taps     = (int32_t) llama_model_target_layer_ids_n(model_dft);
    const int32_t n_vocab    = llama_vocab_n_tokens(llama_model_get_vocab(model_tgt));
    if (width != (int64_t) n_taps * n_embd_tgt) {
        die("features are " + std::to_string(width) + " wide, the draft expects " + std::to_string(n_taps) +
            " taps x " + std::to_string(n_embd_tgt) + " = " + std::to_string((int64_t) n_taps * n_embd_tgt));
    }
    const std::string block_size_s = meta_str(model_dft, "dflash.block_size");
    const bool has_markov = gguf_has_tensor(args.draft, "markov_w1.weight");
    const bool has_conf   = has_markov && gguf_has_tensor(args.draft, "conf_proj.weight");
    if (has_markov && !block_size_s.empty() && n_block > std::atoi(block_size_s.c_str())) {
        die("block of " + std::to_string(n_block) + " tokens exceeds dflash.block_size " + block_size_s +
            ": llama.cpp would silently skip the Markov head");
    }

    // target context: only a provider of token embeddings and lm_head (ctx_other), never decoded
    llama_context * ctx_tgt = session.keep(new_context(model_tgt, context_params(64, 64, args.threads),
                                                       "cannot create the target context"));

    // the non-causal block must be one ubatch
    const uint32_t n_rows_max = (uint32_t) std::max<int64_t>(n_ctx_rows, n_block);
    llama_context_params cp = context_params((uint32_t) (n_ctx_rows + n_block + 256), n_rows_max, args.threads);
    set_attention(cp, args.flash_attn, args.cache_type);
    cp.pooling_type    = LLAMA_POOLING_TYPE_NONE;
    cp.embeddings      = false;
    cp.ctx_other       = ctx_tgt;
    cp.yarn_attn_factor = args.yarn_attn_factor;
    dump_state dumps;
    dumps.watch(args.dump, cp);
    llama_context * ctx = session.keep(new_context(model_dft, cp, "cannot create the draft context"));
    llama_set_causal_attn(ctx, false);             // the block attends non-causally (port-map fact 3)
    llama_set_embeddings_nextn(ctx, true, true);   // confidence comes out through the nextn rows

    // 1. context injection: feature rows
    llama_batch_ext * batch = session.keep(llama_batch_ext_init(ctx));
    for (int64_t i = 0; i < n_ctx_rows; ++i) {
        int32_t idx = 0;
        if (!add_row(batch, feat_f32.data() + i * width, (size_t) width, args.ctx_pos0 + (llama_pos) i, &idx)) {
            die("cannot add feature row " + std::to_string(i) + " to the batch (rc " + std::to_string(idx) + ")");
        }
    }
    if (n_ctx_rows > 0) {
        const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
        if (rc != 0) {
            die("feature injection failed, llama_process rc = " + std::to_string(rc));
        }
    }

    // 2. the block; embeddings on to read the final-normed hidden state as well
    llama_set_embeddings(ctx, true);
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n_block; ++i) {
        int32_t idx = 0;
        if (!add_token(batch, block[i], block_pos0 + i, true, &idx)) {
            die("cannot add block token " + std::to_string(block[i]) + " (rc " + std::to_string(idx) + ")");
        }
    }
    const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
    if (rc != 0) {
        die("block decode failed, llama_process rc = " + std::to_string(rc));
    }

    std::vector<float>   biased((size_t) n_block * n_vocab);
    std::vector<float>   hidden((size_t) n_block * n_embd_dft);
    std::vector<int32_t> chain(n_block);
    std::vector<float>   conf(n_block);
    for (int32_t i = 0; i < n_block; ++i) {
        const float * lg = llama_get_logits_ith(ctx, i);
        const float * h  = llama_get_embeddings_ith(ctx, i);
        if (!lg || !h) {
            die("no logits/embeddings for block row " + std::to_string(i));
        }
        std::memcpy(biased.data() + (size_t) i * n_vocab, lg, sizeof(float) * n_vocab);
        std::memcpy(hidden.data() + (size_t) i * n_embd_dft, h, sizeof(float) * n_embd_dft);
        chain[i] = (int32_t) (std::max_element(lg, lg + n_vocab) - lg);
        if (has_conf) {
            const float * c = llama_get_embeddings_nextn_ith(ctx, i);
            if (!c) {
                die("no confidence output for block row " + std::to_string(i));
            }
            conf[i] = c[0];
        }
    }

    // base logits: llama.cpp's hidden state times the target's lm_head, accumulated in double
    std::vector<double> base;
    if (args.base_logits) {
        int64_t ne0 = 0, ne1 = 0;
        const std::vector<float> head = read_gguf_tensor_f32(args.target, "output.weight", ne0, ne1);
        if (ne0 != n_embd_dft || ne1 != n_vocab) {
            die("target output.weight is " + std::to_string(ne0) + " x " + std::to_string(ne1) + ", expected " +
                std::to_string(n_embd_dft) + " x " + std::to_string(n_vocab));
        }
        base.resize((size_t) n_block * n_vocab);
        for (int32_t i = 0; i < n_block; ++i) {
            const float * h = hidden.data() + (size_t) i * n_embd_dft;
            for (int64_t v = 0; v < n_vocab; ++v) {
                const float * w = head.data() + v * ne0;
                double acc = 0.0;
                for (int64_t e = 0; e < ne0; ++e) {
                    acc += (double) h[e] * (double) w[e];
                }
                base[(size_t) i * n_vocab + v] = acc;
            }
        }
    }

    const std::string out = args.out;
    std::filesystem::create_directories(out);
    npy_save(out + "/biased_logits.npy", "<f4", {n_block, n_vocab}, biased.data(), biased.size() * sizeof(float));
    npy_save(out + "/chain.npy", "<i4", {n_block}, chain.data(), chain.size() * sizeof(int32_t));
    npy_save(out + "/hidden.npy", "<f4", {n_block, n_embd_dft}, hidden.data(), hidden.size() * sizeof(float));
    if (args.base_logits) {
        npy_save(out + "/base_logits.npy", "<f8", {n_block, n_vocab}, base.data(), base.size() * sizeof(double));
    }
    if (has_conf) {
        npy_save(out + "/confidence.npy", "<f4", {n_block}, conf.data(), conf.size() * sizeof(float));
    }
    dumps.save(out);

    // the draft's KV cache line, for bytes per token
    std::string kv_line;
    {
        std::stringstream ls(g_log);
        std::string line;
        while (std::getline(ls, line)) {
            if (line.find("llama_kv_cache: size") != std::string::npos) {
                kv_line = line;   // the last one is the draft's (created after the target's)
            }
        }
    }
    // exact draft context memory (the KV cache: the draft has no recurrent state) and its cells
    size_t kv_bytes = 0;
    for (const auto & it : llama_get_memory_breakdown(ctx)) {
        kv_bytes += it.second.context;
    }
    std::ofstream meta(out + "/meta.json");
    meta << "{\n"
         << "  \"n_ctx_rows\": " << n_ctx_rows << ",\n"
         << "  \"n_block\": " << n_block << ",\n"
         << "  \"ctx_pos0\": " << args.ctx_pos0 << ",\n"
         << "  \"block_pos0\": " << block_pos0 << ",\n"
         << "  \"n_vocab\": " << n_vocab << ",\n"
         << "  \"n_embd\": " << n_embd_dft << ",\n"
         << "  \"n_taps\": " << n_taps << ",\n"
         << "  \"block_size\": \"" << block_size_s << "\",\n"
         << "  \"sample_from_anchor\": \"" << meta_str(model_dft, "dflash.sample_from_anchor") << "\",\n"
         << "  \"has_markov\": " << (has_markov ? "true" : "false") << ",\n"
         << "  \"has_confidence\": " << (has_conf ? "true" : "false") << ",\n"
         << "  \"flash_attn\": \"" << args.flash_attn << "\",\n"
         << "  \"cache_type\": \"" << args.cache_type << "\",\n"
         << "  \"rpc\": \"" << args.rpc << "\",\n"
         << "  \"draft_devices\": \"" << json_escape(args.draft_devices) << "\",\n"
         << "  \"target_devices\": \"" << json_escape(args.target_devices) << "\",\n"
         << "  \"kv_cache_bytes\": " << kv_bytes << ",\n"
         << "  \"kv_cells\": " << llama_n_ctx(ctx) << ",\n"
         << "  \"system_info\": \"" << json_escape(llama_print_system_info()) << "\",\n"
         << "  \"kv_cache_line\": \"" << json_escape(kv_line) << "\"\n"
         << "}\n";
    std::ofstream(out + "/llama.log") << g_log;
    return 0;
}

int main(int argc, char ** argv) {
    return run_main("draft-logits", run, argc, argv);
}
