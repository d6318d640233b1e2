// load-check: does the patched llama.cpp accept each of many DFlash/DSpark draft GGUFs
// against one target? The loader side of the doctor's differential test.
//
// For every draft it does what llama-speculative-simple --spec-type draft-dspark does up to
// and including one drafting step, through the public API:
//   1. load the draft model (in 2);
//   2. create a fresh target context and pair the draft with it as the tools do
//      (common_speculative_init_from_params: the pair check, then the draft context);
//   3. read the DFlash metadata the speculative driver reads (block size, anchor layout,
//      causality), switch the target's layer-input extraction on for the taps, the draft to
//      non-causal attention and nextn (confidence) outputs;
//   4. decode a short prompt on the target, inject its layer inputs into the draft as feature
//      rows, decode one block [anchor, MASK...] and read every row's logits.
//
// Protocol (stdout, one line each, flushed):  BEGIN <i>  then  END <i> <accepted|refused> <stage> <message>
// A draft that aborts the process leaves a BEGIN without END: the caller records the abort and
// restarts the program on the remaining drafts. A draft that takes longer than --seconds
// (default 30) is ended by SIGALRM the same way: a hang counts as a refusal too. llama.cpp's ERROR log lines of the current
// draft are the message of a refusal.
#include "scaffold.h"   // before common.h, whose die() macro would rewrite diag.h's die()

#include "common.h"
#include "llama.h"
#include "llama-ext.h"
#include "log.h"
#include "speculative.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

static std::string g_errors;   // llama.cpp ERROR lines of the current draft

static void errors_cb(ggml_log_level level, const char * text, void * /*user*/) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        g_errors += text;
    }
}

static std::string one_line(std::string s) {
    for (char & c : s) {
        if (c == '\n' || c == '\t' || c == '\r') {
            c = ' ';
        }
    }
    return s.size() > 600 ? s.substr(0, 600) : s;
}

static void emit(size_t i, bool ok, const char * stage, const std::string & msg) {
    std::printf("END\t%zu\t%s\t%s\t%s\n", i, ok ? "accepted" : "refused", stage, one_line(msg).c_str());
    std::fflush(stdout);
}

struct ctx_guard { llama_context * ctx = nullptr; ~ctx_guard() { if (ctx) llama_free(ctx); } };

// returns the stage that failed ("" when the draft was accepted)
static const char * check_draft(const std::string & path, llama_model * model_tgt, int threads, const std::string & log_path,
        std::string & why) {
    const int32_t n_ctx = 256;
    ctx_guard tgt{llama_init_from_model(model_tgt, context_params(n_ctx, n_ctx, threads))};
    if (!tgt.ctx) {
        why = "cannot create the target context";
        return "target";
    }

    // the pairing the tools run: load, check against the target, draft context (its errors go to common's log)
    common_params params;
    params.n_gpu_layers = 0;
    params.n_ctx = params.n_batch = params.n_ubatch = n_ctx;
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads;
    params.speculative.draft.mparams.path = path;
    common_log_set_file(common_log_main(), log_path.c_str());
    auto init = common_speculative_init_from_params(params, model_tgt, tgt.ctx);
    common_log_flush(common_log_main());
    std::ifstream log_in(log_path);
    for (std::string line; std::getline(log_in, line);) {
        why = line.find("does not fit") != std::string::npos ? "the draft " + line.substr(line.find("does not fit")) : why;
    }
    llama_model * model_dft = init->model();
    llama_context * dft_ctx = init->context();
    if (!model_dft || !dft_ctx) {
        why = !model_dft ? "llama_model_load_from_file failed" : why.empty() ? "cannot create the draft context" : why;
        return !model_dft ? "load" : why.rfind("the draft does not fit", 0) == 0 ? "pair" : "context";
    }

    if (meta_str(model_dft, "general.architecture") != "dflash" || llama_model_target_layer_ids_n(model_dft) == 0) {
        why = "not a DFlash draft with target_layers (architecture '" + meta_str(model_dft, "general.architecture") + "')";
        return "spec";
    }

    // what common_speculative_impl_draft_dflash reads and sets
    int32_t block_size = std::atoi(meta_str(model_dft, "dflash.block_size", "16").c_str());
    const bool anchor_first = meta_str(model_dft, "dflash.sample_from_anchor", "true") == "true";
    const bool causal = meta_str(model_dft, "dflash.attention.causal", "false") == "true";
    const bool dflash2 = llama_model_dflash_selector_top_k(model_dft) > 0;
    const int32_t n_draft = std::max(0, std::min<int32_t>(3, anchor_first ? block_size : block_size - 1));
    const llama_token mask = llama_vocab_mask(llama_model_get_vocab(model_dft));

    const int32_t * taps = llama_model_target_layer_ids(model_dft);
    const uint32_t n_taps = llama_model_target_layer_ids_n(model_dft);
    for (uint32_t k = 0; k < n_taps; ++k) {
        llama_set_embeddings_layer_inp(tgt.ctx, (uint32_t) taps[k], true);
    }
    llama_set_embeddings_nextn(dft_ctx, true, !dflash2);
    llama_set_causal_attn(dft_ctx, causal);

    // target prompt: a few token ids, every row an output
    const int32_t n_prompt = 6;
    const int32_t n_vocab_tgt = llama_vocab_n_tokens(llama_model_get_vocab(model_tgt));
    llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    for (int32_t i = 0; i < n_prompt; ++i) {
        batch.token[i] = (i * 7 + 1) % n_vocab_tgt;
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = true;
    }
    batch.n_tokens = n_prompt;
    const int32_t rc_tgt = llama_decode(tgt.ctx, batch);
    llama_batch_free(batch);
    if (rc_tgt != 0) {
        why = "target decode failed, rc " + std::to_string(rc_tgt);
        return "target";
    }
    const float * last = llama_get_logits_ith(tgt.ctx, n_prompt - 1);
    const llama_token anchor = (llama_token) (std::max_element(last, last + n_vocab_tgt) - last);

    // features: [taps x target n_embd] per prompt token
    const int32_t n_embd_tgt = llama_model_n_embd(model_tgt);
    const size_t width = (size_t) n_taps * n_embd_tgt;
    std::vector<float> feats((size_t) n_prompt * width);
    for (uint32_t k = 0; k < n_taps; ++k) {
        const float * layer = llama_get_embeddings_layer_inp(tgt.ctx, (uint32_t) taps[k]);
        if (!layer) {
            why = "target layer input " + std::to_string(taps[k]) + " was not extracted";
            return "features";
        }
        for (int32_t i = 0; i < n_prompt; ++i) {
            std::memcpy(feats.data() + i * width + k * n_embd_tgt, layer + (size_t) i * n_embd_tgt, sizeof(float) * n_embd_tgt);
        }
    }

    llama_batch_ext * bx = llama_batch_ext_init(dft_ctx);
    struct batch_guard { llama_batch_ext * b; ~batch_guard() { llama_batch_ext_free(b); } } bg{bx};
    for (int32_t i = 0; i < n_prompt; ++i) {
        int32_t idx = 0;
        if (!add_row(bx, feats.data() + i * width, width, i, &idx)) {
            why = "cannot add feature row " + std::to_string(i) + " (rc " + std::to_string(idx) + ")";
            return "inject";
        }
    }
    const int32_t rc_inj = llama_process(dft_ctx, LLAMA_PROCESS_TYPE_DECODE, bx);
    if (rc_inj != 0) {
        why = "feature injection failed, rc " + std::to_string(rc_inj);
        return "inject";
    }
    if (n_draft == 0) {
        return "";   // the driver clamps the draft to nothing: it runs, drafting no token
    }

    llama_batch_ext_clear(bx);
    for (int32_t i = 0; i < n_draft; ++i) {
        int32_t idx = 0;
        if (!add_token(bx, i == 0 ? anchor : mask, n_prompt + i, !dflash2, &idx)) {
            why = "cannot add block token " + std::to_string(i == 0 ? anchor : mask) + " (rc " + std::to_string(idx) + ")";
            return "block";
        }
    }
    const int32_t rc_blk = llama_process(dft_ctx, LLAMA_PROCESS_TYPE_DECODE, bx);
    if (rc_blk != 0) {
        why = "block decode failed, rc " + std::to_string(rc_blk);
        return "block";
    }
    for (int32_t i = 0; i < n_draft && !dflash2; ++i) {
        if (!llama_get_logits_ith(dft_ctx, i)) {
            why = "no logits for block row " + std::to_string(i);
            return "block";
        }
    }
    return "";
}

int main(int argc, char ** argv) {
    std::string target, list;
    int threads = 1;
    unsigned seconds = 30;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        if (k == "--target" && i + 1 < argc) {
            target = argv[++i];
        } else if (k == "--list" && i + 1 < argc) {
            list = argv[++i];
        } else if (k == "--threads" && i + 1 < argc) {
            threads = std::atoi(argv[++i]);
        } else if (k == "--seconds" && i + 1 < argc) {
            seconds = (unsigned) std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr, "usage: load-check --target T.gguf --list DRAFTS.txt [--threads N] [--seconds S]\n");
            return 2;
        }
    }
    if (target.empty() || list.empty()) {
        std::fprintf(stderr, "usage: load-check --target T.gguf --list DRAFTS.txt [--threads N] [--seconds S]\n");
        return 2;
    }
    std::vector<std::string> drafts;
    {
        std::ifstream in(list);
        for (std::string line; std::getline(in, line);) {
            if (!line.empty()) {
                drafts.push_back(line);
            }
        }
    }

    llama_session session(errors_cb);
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model_tgt = llama_model_load_from_file(target.c_str(), mparams);
    if (!model_tgt) {
        std::fprintf(stderr, "load-check: cannot load the target %s:\n%s\n", target.c_str(), g_errors.c_str());
        return 2;
    }
    session.keep(model_tgt);
    // common's log of each pairing (its refusal reason), beside the list: the caller's work dir
    const std::string log_path = list + ".common.log";

    for (size_t i = 0; i < drafts.size(); ++i) {
        std::printf("BEGIN\t%zu\n", i);
        std::fflush(stdout);
        g_errors.clear();
        std::string why;
        alarm(seconds);
        const char * stage = check_draft(drafts[i], model_tgt, threads, log_path, why);
        alarm(0);
        const bool ok = stage[0] == '\0';
        emit(i, ok, ok ? "-" : stage, ok ? "" : (g_errors.empty() ? why : g_errors + " | " + why));
    }
    std::remove(log_path.c_str());
    return 0;
}
