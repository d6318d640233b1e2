// draft-bench: time the patched llama.cpp draft's two passes at whatever size the files have:
//   * context injection of N target-feature rows (for each N of --inject),
//   * one block of --block tokens [anchor, MASK...] over --block-ctx cached rows,
// each --repeats times after one untimed warm-up (and again until --min-seconds of timed runs),
// driven through the public API exactly like draft-logits (ctx_other = a target context,
// non-causal block, nextn confidence rows). --bw-mib M reads an M MiB buffer (bandwidth.h)
// right before every timed pass: each pass comes with the read bandwidth of its own moment.
// With --profile, one more block runs with an eval callback that times every graph node
// (the scheduler then computes node by node: slower in total, but the shares are per op).
//
// Placement (default: everything on the CPU): --draft-devices / --target-devices DEV,... put
// each model's layers on those llama.cpp devices (CUDA0, ...), as draft-logits does; every
// timed pass ends with llama_synchronize, so a GPU pass is timed to its end. OUT.json.log
// holds llama.cpp's whole log (with GGML_SCHED_DEBUG=2: the scheduler's splits per graph).
//
// Output (--out): JSON {"inject": {"N": [seconds...]}, "block_seconds": [seconds...],
// "inject_bw_gbps": {"N": [GB/s...]}, "block_bw_gbps": [...], "profile": [...],
// "profile_inject": {"N": {"seconds": s, "nodes": [...]}}, ...}
#include "llama.h"
#include "llama-ext.h"
#include "ggml.h"
#include "ggml-backend.h"

#include "bandwidth.h"
#include "clock.h"
#include "scaffold.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

struct args_t {
    std::string draft, target, out;
    std::vector<int> inject = {1, 64, 512};
    int32_t block      = 7;
    int32_t block_ctx  = 512;
    int32_t repeats    = 3;
    double  min_seconds = 0.0;
    int32_t bw_mib     = 0;
    int32_t threads    = 2;
    std::string flash_attn = "off";
    std::string cache_type = "f16";
    std::string draft_devices, target_devices;
    bool profile = false;
    bool profile_only = false;
    std::vector<int> profile_inject;
    bool extra_bufts = true;
};

static const char * usage =
        "usage: draft-bench --draft D.gguf --target T.gguf --out OUT.json [--inject 1,64,512] [--block 7]\n"
        "                   [--block-ctx 512] [--repeats 3] [--threads N] [--flash-attn on|off]\n"
        "                   [--cache-type f16|f32|bf16|q8_0] [--profile | --profile-only] [--no-extra-bufts]\n"
        "                   [--verbose] [--draft-devices DEV,...] [--target-devices DEV,...]\n"
        "                   [--profile-inject N,...] [--min-seconds S] [--bw-mib M]\n"
        "  --profile-only: no timed passes, only one warm-up block and the profiled block\n"
        "  --profile-inject N,...: also profile one injection of N rows for each N (after an untimed one)\n"
        "  --min-seconds S: repeat each pass beyond --repeats until its timed runs add up to S (at most 200)\n"
        "  --bw-mib M: time a read of an M MiB buffer right before every timed pass (0: off)\n";

static args_t parse_args(int argc, char ** argv) {
    args_t a;
    parse_flags(argc, argv, {
        {"--draft", a.draft}, {"--target", a.target}, {"--out", a.out}, {"--inject", a.inject}, {"--block", a.block},
        {"--block-ctx", a.block_ctx}, {"--repeats", a.repeats}, {"--threads", a.threads},
        {"--flash-attn", a.flash_attn}, {"--cache-type", a.cache_type}, {"--profile", a.profile},
        {"--profile-only", [&] { a.profile = a.profile_only = true; }}, {"--profile-inject", a.profile_inject},
        {"--min-seconds", a.min_seconds}, {"--bw-mib", a.bw_mib}, {"--no-extra-bufts", [&] { a.extra_bufts = false; }},
        {"--verbose", g_verbose}, {"--draft-devices", a.draft_devices}, {"--target-devices", a.target_devices},
    }, usage);
    if (a.draft.empty() || a.target.empty() || a.out.empty()) {
        die_usage(usage, "--draft, --target and --out are required");
    }
    if (a.repeats < 1 || a.block < 1 || a.block_ctx < 0 || a.min_seconds < 0 || a.bw_mib < 0) {
        die("--repeats and --block must be >= 1; --block-ctx, --min-seconds and --bw-mib >= 0");
    }
    for (int n : a.profile_inject) {
        if (n < 1) {
            die("--profile-inject sizes must be >= 1");
        }
    }
    return a;
}

// ---------------------------------------------------------------------------------------
// per-node timing through the scheduler's eval callback

struct node_time {
    std::string name, op, type0, type1;
    int64_t ne0[4], ne1[4], ne[4];
    double seconds;
    double cpu_seconds;   // process CPU time over the node: with --threads 1, the node's work, busy machine or not
};

struct profiler {
    bool   on = false;
    double t_ask = 0.0;
    double c_ask = 0.0;
    std::vector<node_time> nodes;
};

static bool profile_cb(ggml_tensor * t, bool ask, void * user) {
    auto * p = (profiler *) user;
    if (!p->on) {
        return false;
    }
    if (ask) {
        p->t_ask = now_s();
        p->c_ask = cpu_s();
        return true;    // observe every node: the scheduler computes them one at a time
    }
    node_time n;
    n.seconds = now_s() - p->t_ask;
    n.cpu_seconds = cpu_s() - p->c_ask;
    n.name  = t->name;
    n.op    = ggml_op_desc(t);
    n.type0 = t->src[0] ? ggml_type_name(t->src[0]->type) : "";
    n.type1 = t->src[1] ? ggml_type_name(t->src[1]->type) : "";
    for (int i = 0; i < 4; ++i) {
        n.ne[i]  = t->ne[i];
        n.ne0[i] = t->src[0] ? t->src[0]->ne[i] : 0;
        n.ne1[i] = t->src[1] ? t->src[1]->ne[i] : 0;
    }
    p->nodes.push_back(std::move(n));
    return true;
}

static std::string json_str(const std::string & s) {
    return "\"" + json_escape(s) + "\"";
}

static std::string json_ne(const int64_t * ne) {
    return "[" + std::to_string(ne[0]) + "," + std::to_string(ne[1]) + "," + std::to_string(ne[2]) + "," +
           std::to_string(ne[3]) + "]";
}

static int run(int argc, char ** argv) {
    const args_t args = parse_args(argc, argv);
    llama_session session;

    const std::vector<ggml_backend_dev_t> devs_tgt = parse_devices(args.target_devices);
    const std::vector<ggml_backend_dev_t> devs_dft = parse_devices(args.draft_devices);
    llama_model_params mp_tgt = placed_params(devs_tgt);
    llama_model_params mp_dft = placed_params(devs_dft);
    mp_tgt.use_extra_bufts = mp_dft.use_extra_bufts = args.extra_bufts;
    const double t_load0 = now_s();
    llama_model * model_tgt = session.keep(load_model(args.target, mp_tgt, "cannot load target "));
    llama_model * model_dft = session.keep(load_model(args.draft, mp_dft, "cannot load draft "));
    const double t_load = now_s() - t_load0;

    const int32_t n_embd_tgt = llama_model_n_embd(model_tgt);
    const int32_t n_taps     = (int32_t) llama_model_target_layer_ids_n(model_dft);
    const int64_t width      = (int64_t) n_taps * n_embd_tgt;
    const int32_t n_vocab    = llama_vocab_n_tokens(llama_model_get_vocab(model_tgt));
    const std::string mask_s = meta_str(model_dft, "tokenizer.ggml.mask_token_id");
    const llama_token mask_id = !mask_s.empty() ? (llama_token) std::atol(mask_s.c_str()) : n_vocab - 3;

    int32_t n_inject_max = args.block_ctx;
    for (int n : args.inject) {
        n_inject_max = std::max(n_inject_max, n);
    }
    for (int n : args.profile_inject) {
        n_inject_max = std::max(n_inject_max, n);
    }

    llama_context * ctx_tgt = session.keep(new_context(model_tgt, context_params(64, 64, args.threads),
                                                       "cannot create the target context"));

    // one ubatch per pass, as the speculative driver uses
    profiler prof, prof_inject;
    llama_context_params cp = context_params((uint32_t) (n_inject_max + args.block + 256),
                                             (uint32_t) std::max(n_inject_max, args.block), args.threads);
    set_attention(cp, args.flash_attn, args.cache_type);
    cp.pooling_type    = LLAMA_POOLING_TYPE_NONE;
    cp.embeddings      = false;
    cp.ctx_other       = ctx_tgt;
    // one callback for both profiles: it records into whichever profiler is switched on
    struct profilers { profiler * block; profiler * inject; } profs = { &prof, &prof_inject };
    if (args.profile || !args.profile_inject.empty()) {
        cp.cb_eval = [](ggml_tensor * t, bool ask, void * user) {
            auto * ps = (profilers *) user;
            return profile_cb(t, ask, ps->block->on ? ps->block : ps->inject);
        };
        cp.cb_eval_user_data = &profs;
    }
    llama_context * ctx = session.keep(new_context(model_dft, cp, "cannot create the draft context"));
    llama_set_causal_attn(ctx, false);
    llama_set_embeddings_nextn(ctx, true, true);
    llama_memory_t mem = llama_get_memory(ctx);

    // random target features, N(0, 1): the values do not change the work
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> feats((size_t) n_inject_max * width);
    for (auto & x : feats) {
        x = nd(rng);
    }

    llama_batch_ext * batch = session.keep(llama_batch_ext_init(ctx));
    double last_cpu = 0.0;   // CPU seconds of the last timed pass
    auto inject = [&](int32_t n, int32_t pos0) {
        llama_batch_ext_clear(batch);
        for (int32_t i = 0; i < n; ++i) {
            if (!add_row(batch, feats.data() + (size_t) i * width, (size_t) width, pos0 + i)) {
                die("cannot add feature row " + std::to_string(i));
            }
        }
        const double t0 = now_s(), c0 = cpu_s();
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) != 0) {
            die("feature injection of " + std::to_string(n) + " rows failed");
        }
        llama_synchronize(ctx);     // no outputs to read: wait for the device explicitly
        last_cpu = cpu_s() - c0;
        return now_s() - t0;
    };
    auto run_block = [&](int32_t pos0) {
        llama_batch_ext_clear(batch);
        for (int32_t i = 0; i < args.block; ++i) {
            if (!add_token(batch, i == 0 ? (llama_token) (n_vocab / 2) : mask_id, pos0 + i, true)) {
                die("cannot add block token " + std::to_string(i));
            }
        }
        const double t0 = now_s(), c0 = cpu_s();
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) != 0) {
            die("block decode failed");
        }
        llama_synchronize(ctx);
        last_cpu = cpu_s() - c0;
        // the caller reads every row's logits: make sure they are there
        for (int32_t i = 0; i < args.block; ++i) {
            if (!llama_get_logits_ith(ctx, i)) {
                die("no logits for block row " + std::to_string(i));
            }
        }
        return now_s() - t0;
    };

    // the timed runs of one pass, each with the read bandwidth sampled right before it
    struct timed_runs {
        std::vector<double> seconds, cpu, bw_gbps, bw_cpu_share;
        double total = 0.0;
    };
    std::unique_ptr<read_bandwidth> reader;
    if (args.bw_mib > 0) {
        reader = std::make_unique<read_bandwidth>((size_t) args.bw_mib << 20);
    }
    const size_t max_runs = 200;
    auto more = [&](const timed_runs & t) {
        return t.seconds.size() < (size_t) args.repeats || (t.total < args.min_seconds && t.seconds.size() < max_runs);
    };
    auto sample_bw = [&](timed_runs & t) {
        if (reader) {
            settle();      // the pass's worker threads may still spin (OpenMP): not on the reader's cores
            double share = 0.0;
            t.bw_gbps.push_back(reader->pass(args.threads, &share));
            t.bw_cpu_share.push_back(share);
        }
    };
    auto record = [&](timed_runs & t, double seconds) {
        t.seconds.push_back(seconds);
        t.cpu.push_back(last_cpu);
        t.total += seconds;
    };

    // injections: the cache emptied before each, one untimed warm-up per size
    std::map<int, timed_runs> t_inject;
    for (int n : args.profile_only ? std::vector<int>() : args.inject) {
        llama_memory_clear(mem, true);
        inject(n, 0);
        timed_runs & t = t_inject[n];
        while (more(t)) {
            llama_memory_clear(mem, true);
            sample_bw(t);
            record(t, inject(n, 0));
        }
    }

    // block over block_ctx cached rows; its own rows are removed again after each run,
    // as the speculative driver rolls them back
    llama_memory_clear(mem, true);
    if (args.block_ctx > 0) {
        inject(args.block_ctx, 0);
    }
    run_block(args.block_ctx);
    llama_memory_seq_rm(mem, 0, args.block_ctx, -1);
    timed_runs t_block;
    while (!args.profile_only && more(t_block)) {
        sample_bw(t_block);
        record(t_block, run_block(args.block_ctx));
        llama_memory_seq_rm(mem, 0, args.block_ctx, -1);
    }

    double t_profiled = 0.0;
    if (args.profile) {
        prof.on = true;
        t_profiled = run_block(args.block_ctx);
        llama_memory_seq_rm(mem, 0, args.block_ctx, -1);
        prof.on = false;
    }

    std::map<int, std::pair<double, std::vector<node_time>>> profiled_inject;
    for (int n : args.profile_inject) {
        llama_memory_clear(mem, true);
        inject(n, 0);      // untimed: the graph for this size is built and reserved
        llama_memory_clear(mem, true);
        prof_inject.nodes.clear();
        prof_inject.on = true;
        const double s = inject(n, 0);
        prof_inject.on = false;
        profiled_inject[n] = {s, prof_inject.nodes};
    }

    size_t kv_bytes = 0;
    for (const auto & it : llama_get_memory_breakdown(ctx)) {
        kv_bytes += it.second.context;
    }

    std::ofstream o(args.out);
    o << "{\n  \"threads\": " << args.threads << ",\n"
      << "  \"flash_attn\": " << json_str(args.flash_attn) << ",\n"
      << "  \"cache_type\": " << json_str(args.cache_type) << ",\n"
      << "  \"draft_devices\": " << json_str(args.draft_devices) << ",\n"
      << "  \"target_devices\": " << json_str(args.target_devices) << ",\n"
      << "  \"system_info\": " << json_str(llama_print_system_info()) << ",\n"
      << "  \"block\": " << args.block << ",\n"
      << "  \"block_ctx\": " << args.block_ctx << ",\n"
      << "  \"load_seconds\": " << t_load << ",\n"
      << "  \"kv_cache_bytes\": " << kv_bytes << ",\n"
      << "  \"kv_cells\": " << llama_n_ctx(ctx) << ",\n"
      << "  \"n_vocab\": " << n_vocab << ",\n"
      << "  \"bw_bytes\": " << (reader ? reader->bytes() : 0) << ",\n";
    auto per_size = [&](const char * key, std::vector<double> timed_runs::*field) {
        o << "  \"" << key << "\": {";
        bool first = true;
        for (const auto & it : t_inject) {
            o << (first ? "" : ", ") << "\"" << it.first << "\": " << json_samples(it.second.*field, "%.6f");
            first = false;
        }
        o << "},\n";
    };
    per_size("inject", &timed_runs::seconds);
    per_size("inject_cpu", &timed_runs::cpu);
    per_size("inject_bw_gbps", &timed_runs::bw_gbps);
    per_size("inject_bw_cpu_share", &timed_runs::bw_cpu_share);
    o << "  \"block_seconds\": " << json_samples(t_block.seconds, "%.6f") << ",\n";
    o << "  \"block_cpu\": " << json_samples(t_block.cpu, "%.6f") << ",\n";
    o << "  \"block_bw_gbps\": " << json_samples(t_block.bw_gbps, "%.6f") << ",\n";
    o << "  \"block_bw_cpu_share\": " << json_samples(t_block.bw_cpu_share, "%.6f") << ",\n";
    o << "  \"extra_bufts\": " << (args.extra_bufts ? "true" : "false") << ",\n";
    auto write_nodes = [&](const std::vector<node_time> & nodes) {
        for (size_t i = 0; i < nodes.size(); ++i) {
            const auto & n = nodes[i];
            o << (i ? ",\n    " : "\n    ") << "{\"name\": " << json_str(n.name) << ", \"op\": " << json_str(n.op)
              << ", \"type0\": " << json_str(n.type0) << ", \"type1\": " << json_str(n.type1)
              << ", \"ne\": " << json_ne(n.ne) << ", \"ne0\": " << json_ne(n.ne0) << ", \"ne1\": " << json_ne(n.ne1)
              << ", \"seconds\": " << n.seconds << ", \"cpu_seconds\": " << n.cpu_seconds << "}";
        }
    };
    o << "  \"profiled_block_seconds\": " << t_profiled << ",\n  \"profile\": [";
    write_nodes(prof.nodes);
    o << "],\n  \"profile_inject\": {";
    bool first = true;
    for (const auto & it : profiled_inject) {
        o << (first ? "" : ", ") << "\"" << it.first << "\": {\"seconds\": " << it.second.first << ", \"nodes\": [";
        write_nodes(it.second.second);
        o << "]}";
        first = false;
    }
    o << "}\n}\n";
    o.close();
    std::ofstream(args.out + ".log") << g_log;
    return 0;
}

int main(int argc, char ** argv) {
    return run_main("draft-bench", run, argc, argv);
}
