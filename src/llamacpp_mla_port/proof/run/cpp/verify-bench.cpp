// verify-bench: time the target's verify step as a speculative decoder runs it, through the
// public API on the model as shipped:
//   * T(N): one decode of N tokens (logits for all of them) over --depth cached tokens, for each
//     N of --n, in two contexts side by side: "alone" (no rollback snapshots: the target alone)
//     and "spec" (n_rs_seq = --rs-seq snapshots, the draft's taps extracted: what
//     common_speculative gives the target). A spec pass is followed by the rollback of a
//     rejected block (llama_memory_seq_rm back to its first token), timed apart; the next pass
//     starts there, so recurrent layers restore their state from the snapshot as in a real run.
//     An alone pass starts from the saved state at --depth (restored untimed; each context
//     decodes the prompt itself: a state saved with snapshots has another layout).
//   * rounds: each round times every N in both contexts, N ascending in even rounds and
//     descending in odd ones (side by side, never one N's block then the next).
//   * experts: with --expert-blocks B > 0, a third context reads the router's choice
//     (ffn_moe_topk-IL, eval callback, untimed) for B blocks of N consecutive tokens and for N
//     copies of one token: the distinct experts per MoE layer and step.
//
// Output (--out): JSON {"n": [...], "alone_seconds": {"N": [...]}, "spec_seconds": {...},
// "rollback_seconds": {...}, "*_cpu_share", "experts": {...}, ...}; OUT.log holds llama.cpp's log.
#include "llama.h"
#include "llama-ext.h"
#include "ggml.h"
#include "ggml-backend.h"

#include "clock.h"
#include "scaffold.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

struct args_t {
    std::string target, draft, out, tokens, text, taps, devices, state_dir, flash_attn = "auto";
    std::vector<int> n = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t depth = 1024;
    int32_t rounds = 5;
    int32_t threads = 2;
    int32_t rs_seq = -1;          // -1: max(n) - 1
    int32_t expert_blocks = 8;
    uint32_t seed = 1234;
    bool extra_bufts = true;
};

static const char * usage =
        "usage: verify-bench --target T.gguf --out OUT.json [--n 1,2,...,8] [--depth 1024] [--rounds 5]\n"
        "                    [--threads N] [--rs-seq R] [--draft D.gguf | --taps 3,24,...]\n"
        "                    [--tokens ids.npy|1,2,3 | --text FILE]\n"
        "                    [--seed S] [--flash-attn auto|on|off] [--expert-blocks B] [--target-devices DEV,...]\n"
        "                    [--state-dir DIR] [--verbose] [--no-extra-bufts]\n"
        "  --rs-seq R: rollback snapshots of the spec context (default max(n) - 1, as common_speculative sets\n"
        "              n_rs_seq = --spec-draft-n-max); --draft/--taps: the layer inputs the spec context extracts\n"
        "  --tokens / --text: the prompt (depth tokens) and what follows (the verified blocks), as ids or as text\n"
        "              the target's tokenizer reads (repeated when short); default seeded random ids\n"
        "  --state-dir DIR: the prompt's state per context kind is saved there once and loaded by later runs\n"
        "  --no-extra-bufts: weights in plain CPU buffers (llama.cpp's --no-repack: no AMX, no repacking)\n";

static args_t parse_args(int argc, char ** argv) {
    args_t a;
    parse_flags(argc, argv, {
        {"--target", a.target}, {"--draft", a.draft}, {"--out", a.out}, {"--tokens", a.tokens}, {"--text", a.text},
        {"--taps", a.taps}, {"--n", a.n}, {"--depth", a.depth}, {"--rounds", a.rounds}, {"--threads", a.threads},
        {"--rs-seq", a.rs_seq}, {"--expert-blocks", a.expert_blocks}, {"--seed", a.seed},
        {"--flash-attn", a.flash_attn}, {"--target-devices", a.devices}, {"--state-dir", a.state_dir},
        {"--verbose", g_verbose}, {"--no-extra-bufts", [&] { a.extra_bufts = false; }},
    }, usage);
    if (a.target.empty() || a.out.empty()) {
        die_usage(usage, "--target and --out are required");
    }
    if (a.n.empty() || a.depth < 1 || a.rounds < 1 || a.threads < 1 || a.expert_blocks < 0) {
        die("--n needs at least one size; --depth, --rounds and --threads must be >= 1, --expert-blocks >= 0");
    }
    for (int n : a.n) {
        if (n < 1 || n > 64) {
            die("--n sizes must be in 1..64, got " + std::to_string(n));
        }
    }
    const int n_max = *std::max_element(a.n.begin(), a.n.end());
    if (a.rs_seq < 0) {
        a.rs_seq = std::max(1, n_max - 1);
    }
    if (a.rs_seq < n_max - 1) {
        die("--rs-seq " + std::to_string(a.rs_seq) + " cannot roll back a block of " + std::to_string(n_max) +
            " tokens: it needs at least " + std::to_string(n_max - 1));
    }
    if (a.flash_attn != "auto" && a.flash_attn != "on" && a.flash_attn != "off") {
        die("--flash-attn takes auto, on or off");
    }
    return a;
}

// the router's choices: every ffn_moe_topk-IL node, ids [n_used, n_tokens] (I32)
struct topk_state {
    bool on = false;
    std::map<std::string, std::vector<int32_t>> ids;   // node name -> ids of the last decode
    std::map<std::string, int64_t>              n_used;
};

static bool topk_cb(ggml_tensor * t, bool ask, void * user) {
    auto * st = (topk_state *) user;
    const bool wanted = st->on && std::strncmp(ggml_get_name(t), "ffn_moe_topk-", 13) == 0 && t->type == GGML_TYPE_I32;
    if (ask) {
        return wanted;
    }
    if (wanted) {
        // a view of the argsort: one row of ne0 ids per token, rows nb[1] apart
        auto & v = st->ids[ggml_get_name(t)];
        v.resize((size_t) (t->ne[0] * t->ne[1]));
        for (int64_t j = 0; j < t->ne[1]; ++j) {
            ggml_backend_tensor_get(t, v.data() + j * t->ne[0], (size_t) j * t->nb[1], (size_t) t->ne[0] * sizeof(int32_t));
        }
        st->n_used[ggml_get_name(t)] = t->ne[0];
    }
    return true;
}

static int run(int argc, char ** argv) {
    const args_t args = parse_args(argc, argv);
    llama_session session;

    const int n_max = *std::max_element(args.n.begin(), args.n.end());
    const std::vector<ggml_backend_dev_t> devs = parse_devices(args.devices);
    llama_model_params mp = placed_params(devs);
    mp.use_extra_bufts = args.extra_bufts;

    std::vector<int32_t> taps;
    if (!args.taps.empty()) {
        for (int t : parse_ints(args.taps)) {
            taps.push_back(t);
        }
    } else if (!args.draft.empty()) {
        llama_model_params mpd = llama_model_default_params();
        mpd.n_gpu_layers = 0;
        mpd.vocab_only = true;
        llama_model * dft = load_model(args.draft, mpd, "cannot read the draft ");
        const int32_t * p = llama_model_target_layer_ids(dft);
        taps.assign(p, p + llama_model_target_layer_ids_n(dft));
        llama_model_free(dft);
    }

    const double t_load0 = now_s();
    llama_model * model = session.keep(load_model(args.target, mp, "cannot load target "));
    const double t_load = now_s() - t_load0;
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    const int32_t n_layer = llama_model_n_layer(model);
    for (int32_t t : taps) {
        if (t < 0 || t >= n_layer) {
            die("tap " + std::to_string(t) + " is not a layer of the target (it has " + std::to_string(n_layer) + ")");
        }
    }

    // the token stream: depth tokens of prompt, then the blocks the passes verify
    const int32_t n_passes = (int32_t) args.n.size() * (args.rounds + 1);
    const int32_t n_stream = args.depth + n_passes + n_max * (args.expert_blocks + 2) + 8;
    std::vector<llama_token> stream;
    if (!args.tokens.empty() || !args.text.empty()) {
        std::vector<llama_token> given;
        if (!args.text.empty()) {
            std::ifstream f(args.text);
            if (!f) {
                die("cannot read --text " + args.text);
            }
            const std::string txt((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
            const int32_t n = -llama_tokenize(vocab, txt.c_str(), (int32_t) txt.size(), nullptr, 0, true, true);
            given.resize((size_t) std::max(0, n));
            if (n > 0 && llama_tokenize(vocab, txt.c_str(), (int32_t) txt.size(), given.data(), n, true, true) < 0) {
                die("cannot tokenize --text " + args.text);
            }
        } else if (args.tokens.size() > 4 && args.tokens.substr(args.tokens.size() - 4) == ".npy") {
            npy_array a = npy_load(args.tokens);
            for (int64_t i = 0; i < a.size(); ++i) {
                given.push_back(a.at<llama_token>(i));
            }
        } else {
            for (int t : parse_ints(args.tokens)) {
                given.push_back(t);
            }
        }
        if (given.empty()) {
            die("--tokens / --text holds no token");
        }
        for (llama_token t : given) {
            if (t < 0 || t >= n_vocab) {
                die("token " + std::to_string(t) + " is outside the target's vocabulary of " + std::to_string(n_vocab));
            }
        }
        for (int32_t i = 0; i < n_stream; ++i) {
            stream.push_back(given[(size_t) i % given.size()]);     // a short prompt repeats
        }
    } else {
        std::mt19937 rng(args.seed);
        std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
        for (int32_t i = 0; i < n_stream; ++i) {
            stream.push_back(pick(rng));
        }
    }

    auto make_ctx = [&](uint32_t n_rs_seq, topk_state * probe) {
        llama_context_params cp = context_params((uint32_t) (args.depth + n_passes + 2 * n_max + 64), 512,
                                                 args.threads);
        cp.n_rs_seq = n_rs_seq;
        cp.flash_attn_type = args.flash_attn == "on"  ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                           : args.flash_attn == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                      : LLAMA_FLASH_ATTN_TYPE_AUTO;
        if (probe) {
            cp.cb_eval = topk_cb;
            cp.cb_eval_user_data = probe;
        }
        return new_context(model, cp, "cannot create a target context (n_ctx " + std::to_string(cp.n_ctx) +
                                      ", n_rs_seq " + std::to_string(n_rs_seq) + ")");
    };
    llama_context * ctx_alone = session.keep(make_ctx(0, nullptr));
    llama_context * ctx_spec  = session.keep(make_ctx((uint32_t) args.rs_seq, nullptr));
    const bool recurrent = llama_model_is_recurrent(model) || llama_model_is_hybrid(model);
    if (recurrent && llama_n_rs_seq(ctx_spec) < (uint32_t) args.rs_seq) {
        die("the target has recurrent layers but its context keeps " + std::to_string(llama_n_rs_seq(ctx_spec)) +
            " rollback snapshots (asked " + std::to_string(args.rs_seq) + "): llama.cpp cannot roll back a rejected "
            "block of this architecture");
    }
    for (int32_t t : taps) {
        llama_set_embeddings_layer_inp(ctx_spec, (uint32_t) t, true);
    }

    auto decode = [&](llama_context * ctx, llama_batch_ext * b, const llama_token * ids, int32_t n, llama_pos pos0,
                      bool all_logits) {
        llama_batch_ext_clear(b);
        for (int32_t i = 0; i < n; ++i) {
            if (!add_token(b, ids[i], pos0 + i, all_logits || i == n - 1)) {
                die("cannot add token " + std::to_string(ids[i]) + " at " + std::to_string(pos0 + i));
            }
        }
        const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, b);
        if (rc != 0) {
            die("decode of " + std::to_string(n) + " tokens at " + std::to_string(pos0) + " failed (rc " +
                std::to_string(rc) + ")");
        }
        llama_synchronize(ctx);
    };
    llama_batch_ext * b_alone = session.keep(llama_batch_ext_init(ctx_alone));
    llama_batch_ext * b_spec  = session.keep(llama_batch_ext_init(ctx_spec));

    // the prompt, in each context (a state saved with rollback snapshots has another layout)
    auto prefill = [&](llama_context * ctx, llama_batch_ext * b) {
        const double t0 = now_s();
        for (int32_t p = 0; p < args.depth; p += 512) {
            const int32_t n = std::min(512, args.depth - p);
            decode(ctx, b, stream.data() + p, n, p, false);
        }
        return now_s() - t0;
    };
    // --state-dir: a prompt decoded once per context kind is saved there and loaded by later runs
    int32_t n_loaded = 0;
    auto prompt_state = [&](llama_context * ctx, llama_batch_ext * b, const char * kind) {
        if (args.state_dir.empty()) {
            return prefill(ctx, b);
        }
        const std::string path = args.state_dir + "/" + kind + "-d" + std::to_string(args.depth) + "-rs" +
            std::to_string(llama_n_rs_seq(ctx)) + "-" +
            (args.tokens.empty() && args.text.empty() ? "s" + std::to_string(args.seed) : "t") +
            ".state";
        std::vector<llama_token> saved((size_t) args.depth);
        size_t n_saved = 0;
        if (std::ifstream(path).good() &&
            llama_state_seq_load_file(ctx, path.c_str(), 0, saved.data(), saved.size(), &n_saved) > 0 &&
            n_saved == (size_t) args.depth && std::equal(saved.begin(), saved.end(), stream.begin())) {
            n_loaded += 1;
            return 0.0;
        }
        llama_memory_seq_rm(llama_get_memory(ctx), 0, -1, -1);
        const double s = prefill(ctx, b);
        if (llama_state_seq_save_file(ctx, path.c_str(), 0, stream.data(), (size_t) args.depth) == 0) {
            die("cannot save the prompt's state to " + path);
        }
        return s;
    };
    const double t_prefill = prompt_state(ctx_alone, b_alone, "alone");
    prompt_state(ctx_spec, b_spec, "spec");
    std::vector<uint8_t> state(llama_state_seq_get_size(ctx_alone, 0));
    if (llama_state_seq_get_data(ctx_alone, state.data(), state.size(), 0) != state.size()) {
        die("cannot save the prompt's state");
    }
    // the alone context and the probe (no snapshots) restore it before each pass
    auto restore = [&](llama_context * ctx) {
        llama_memory_seq_rm(llama_get_memory(ctx), 0, -1, -1);
        if (llama_state_seq_set_data(ctx, state.data(), state.size(), 0) == 0) {
            die("cannot restore the prompt's state");
        }
    };

    llama_pos pos_spec = args.depth;              // the spec context's next position (it grows by one a pass)
    int32_t next_block = args.depth;               // where the next verified block is read from the stream
    std::map<int, std::vector<double>> t_alone, t_spec, t_roll, cpu_alone, cpu_spec;

    auto pass_alone = [&](int n, bool timed) {
        restore(ctx_alone);
        const double c0 = cpu_s(), t0 = now_s();
        decode(ctx_alone, b_alone, stream.data() + args.depth, n, args.depth, true);
        const double dt = now_s() - t0, dc = cpu_s() - c0;
        if (timed) {
            t_alone[n].push_back(dt);
            cpu_alone[n].push_back(dc / (dt * args.threads));
        }
    };
    auto pass_spec = [&](int n, bool timed) {
        const double c0 = cpu_s(), t0 = now_s();
        decode(ctx_spec, b_spec, stream.data() + next_block, n, pos_spec, true);
        const double dt = now_s() - t0, dc = cpu_s() - c0;
        const double r0 = now_s();
        // every drafted token rejected: keep the first (the token the target had already chosen)
        if (!llama_memory_seq_rm(llama_get_memory(ctx_spec), 0, pos_spec + 1, -1)) {
            die("the target cannot roll back a rejected block of " + std::to_string(n - 1) + " tokens");
        }
        const double dr = now_s() - r0;
        pos_spec += 1;
        next_block += 1;
        if (timed) {
            t_spec[n].push_back(dt);
            cpu_spec[n].push_back(dc / (dt * args.threads));
            t_roll[n].push_back(dr);
        }
    };

    for (int n : args.n) {          // warm-up: every graph size built once
        pass_alone(n, false);
        pass_spec(n, false);
    }
    for (int r = 0; r < args.rounds; ++r) {
        std::vector<int> order = args.n;
        if (r % 2) {
            std::reverse(order.begin(), order.end());
        }
        for (int n : order) {
            if ((r + n) % 2) {
                pass_alone(n, true);
                pass_spec(n, true);
            } else {
                pass_spec(n, true);
                pass_alone(n, true);
            }
        }
    }

    // the router's choices, untimed
    topk_state probe;
    std::map<int, std::vector<double>> distinct, distinct_same;
    int64_t n_expert_used = 0;
    int32_t moe_layers = 0;
    if (args.expert_blocks > 0) {
        llama_context * ctx_probe = make_ctx(0, &probe);
        llama_batch_ext * b_probe = llama_batch_ext_init(ctx_probe);
        auto count = [&](int n, std::vector<double> & out) {
            for (const auto & it : probe.ids) {
                const int64_t k = probe.n_used[it.first];
                std::set<int32_t> seen;
                for (int64_t i = 0; i < k * n && i < (int64_t) it.second.size(); ++i) {
                    seen.insert(it.second[(size_t) i]);
                }
                out.push_back((double) seen.size());
                n_expert_used = k;
            }
            moe_layers = (int32_t) probe.ids.size();
        };
        for (int n : args.n) {
            for (int blk = 0; blk < args.expert_blocks; ++blk) {
                llama_memory_seq_rm(llama_get_memory(ctx_probe), 0, -1, -1);
                if (llama_state_seq_set_data(ctx_probe, state.data(), state.size(), 0) == 0) {
                    die("cannot restore the prompt's state (probe)");
                }
                probe.ids.clear();
                probe.on = true;
                decode(ctx_probe, b_probe, stream.data() + args.depth + (size_t) blk * n_max, n, args.depth, true);
                probe.on = false;
                count(n, distinct[n]);
            }
            // N copies of one token: routing can differ only through the context
            std::vector<llama_token> same((size_t) n, stream[(size_t) args.depth]);
            llama_memory_seq_rm(llama_get_memory(ctx_probe), 0, -1, -1);
            llama_state_seq_set_data(ctx_probe, state.data(), state.size(), 0);
            probe.ids.clear();
            probe.on = true;
            decode(ctx_probe, b_probe, same.data(), n, args.depth, true);
            probe.on = false;
            count(n, distinct_same[n]);
        }
        llama_batch_ext_free(b_probe);
        llama_free(ctx_probe);
    }

    const std::string arch = meta_str(model, "general.architecture");
    const int32_t n_expert = std::atoi(meta_str(model, (arch + ".expert_count").c_str()).c_str());

    std::ofstream o(args.out);
    auto per_n = [&](const char * key, const std::map<int, std::vector<double>> & m, bool last = false) {
        o << "  \"" << key << "\": {";
        bool first = true;
        for (const auto & it : m) {
            o << (first ? "" : ", ") << "\"" << it.first << "\": " << json_samples(it.second);
            first = false;
        }
        o << "}" << (last ? "\n" : ",\n");
    };
    o << "{\n  \"threads\": " << args.threads << ",\n"
      << "  \"depth\": " << args.depth << ",\n"
      << "  \"extra_bufts\": " << (args.extra_bufts ? "true" : "false") << ",\n"
      << "  \"rounds\": " << args.rounds << ",\n"
      << "  \"rs_seq\": " << args.rs_seq << ",\n"
      << "  \"rs_seq_effective\": " << llama_n_rs_seq(ctx_spec) << ",\n"
      << "  \"recurrent\": " << (recurrent ? "true" : "false") << ",\n"
      << "  \"flash_attn\": \"" << args.flash_attn << "\",\n"
      << "  \"arch\": \"" << arch << "\",\n"
      << "  \"n_layer\": " << n_layer << ",\n"
      << "  \"n_vocab\": " << n_vocab << ",\n"
      << "  \"model_bytes\": " << llama_model_size(model) << ",\n"
      << "  \"taps\": " << taps.size() << ",\n"
      << "  \"tokens\": \"" << (!args.text.empty() ? "text" : args.tokens.empty() ? "random" : "given") << "\",\n"
      << "  \"load_seconds\": " << t_load << ",\n"
      << "  \"prefill_seconds\": " << t_prefill << ",\n"
      << "  \"prompt_states_loaded\": " << n_loaded << ",\n"
      << "  \"state_bytes\": " << state.size() << ",\n"
      << "  \"system_info\": \"" << llama_print_system_info() << "\",\n"
      << "  \"n\": [";
    for (size_t i = 0; i < args.n.size(); ++i) {
        o << (i ? ", " : "") << args.n[i];
    }
    o << "],\n";
    per_n("alone_seconds", t_alone);
    per_n("spec_seconds", t_spec);
    per_n("rollback_seconds", t_roll);
    per_n("alone_cpu_share", cpu_alone);
    per_n("spec_cpu_share", cpu_spec);
    o << "  \"experts\": {\n    \"n_expert\": " << n_expert << ", \"n_expert_used\": " << n_expert_used
      << ", \"moe_layers\": " << moe_layers << ", \"blocks\": " << args.expert_blocks << ",\n  ";
    per_n("distinct_per_layer", distinct);
    o << "  ";
    per_n("distinct_per_layer_same_token", distinct_same, true);
    o << "  }\n}\n";
    o.close();
    std::ofstream(args.out + ".log") << g_log;
    return 0;
}

int main(int argc, char ** argv) {
    return run_main("verify-bench", run, argc, argv);
}
