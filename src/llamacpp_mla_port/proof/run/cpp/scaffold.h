// Scaffolding shared by the proof programs: the command line (flags bound to variables), main(),
// llama.cpp's setup and teardown (a session), contexts, batch rows, metadata and token lists.
#pragma once

#include "llama.h"
#include "llama-ext.h"

#include "devices.h"
#include "diag.h"
#include "npy.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// one command-line flag: the variable its value sets (a bool: a switch that sets it) or an action
struct flag {
    std::string name;
    std::function<void(const std::string &)> set;
    bool takes_value = true;

    template <typename T> flag(std::string n, T & v) : name(std::move(n)), takes_value(!std::is_same_v<T, bool>) {
        set = [&v](const std::string & s) {
            if constexpr (std::is_same_v<T, bool>)                  v = true;
            else if constexpr (std::is_same_v<T, std::string>)      v = s;
            else if constexpr (std::is_same_v<T, std::vector<int>>) v = parse_ints(s);
            else if constexpr (std::is_same_v<T, float>)            v = std::stof(s);
            else if constexpr (std::is_same_v<T, double>)           v = std::stod(s);
            else if constexpr (std::is_same_v<T, int>)              v = std::stoi(s);
            else { static_assert(std::is_unsigned_v<T>, "no flag of this type"); v = (T) std::stoul(s); }
        };
    }
    flag(std::string n, std::function<void()> action)
        : name(std::move(n)), set([action](const std::string &) { action(); }), takes_value(false) {}
};

[[noreturn]] inline void die_usage(const char * usage, const std::string & msg) {
    if (usage) {
        std::fputs(usage, stderr);
    }
    die(msg);
}

// argv against flags: -h/--help prints the usage and exits 0, a bad command line prints it and dies
// (terse: only the usage for an unknown flag, only the error for a missing value; no usage: -h is unknown)
inline void parse_flags(int argc, char ** argv, const std::vector<flag> & flags, const char * usage,
                        bool terse = false) {
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        const auto f = std::find_if(flags.begin(), flags.end(), [&](const flag & x) { return x.name == k; });
        if (f == flags.end() && !usage) {
            die("unknown argument " + k + " (see the header of " + g_prog + ".cpp)");
        }
        if (f == flags.end()) {
            std::fputs(usage, stderr);
            if (k == "-h" || k == "--help" || terse) {
                std::exit(k == "-h" || k == "--help" ? 0 : 1);
            }
            die("unknown argument " + k);
        }
        if (f->takes_value && i + 1 >= argc) {
            die_usage(terse ? nullptr : usage, "missing value for " + k);
        }
        f->set(f->takes_value ? argv[++i] : "");
    }
}

// a program's main(): run() under the program's name, an exception it throws ended by die()
inline int run_main(const char * prog, int (*run)(int, char **), int argc, char ** argv) {
    g_prog = prog;
    try {
        return run(argc, argv);
    } catch (const std::exception & err) {
        die(err.what());
    }
}

// the model at path, or die with err followed by the path
inline llama_model * load_model(const std::string & path, const llama_model_params & mp, const char * err) {
    llama_model * model = llama_model_load_from_file(path.c_str(), mp);
    if (!model) {
        die(err + path);
    }
    return model;
}

inline llama_context * new_context(llama_model * model, const llama_context_params & cp, const std::string & err) {
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die(err);
    }
    return ctx;
}

// llama.cpp for one program: the log captured (diag.h), the backend, and what keep() was given, all
// freed in reverse order at the end; not while an exception is on its way to die(), as exit() does not
struct llama_session {
    explicit llama_session(ggml_log_callback cb = log_cb) {
        llama_log_set(cb, nullptr);
        llama_backend_init();
    }
    ~llama_session() {
        if (std::uncaught_exceptions() > 0) {
            return;
        }
        for (auto it = frees.rbegin(); it != frees.rend(); ++it) {
            (*it)();
        }
        llama_backend_free();
    }
    llama_session(const llama_session &) = delete;
    llama_session & operator=(const llama_session &) = delete;

    llama_model *     keep(llama_model * m)     { frees.push_back([m] { llama_model_free(m); });     return m; }
    llama_context *   keep(llama_context * c)   { frees.push_back([c] { llama_free(c); });           return c; }
    llama_batch_ext * keep(llama_batch_ext * b) { frees.push_back([b] { llama_batch_ext_free(b); }); return b; }

    std::vector<std::function<void()>> frees;
};

// one sequence, one ubatch of n_batch, the same threads for both phases
inline llama_context_params context_params(uint32_t n_ctx, uint32_t n_batch, int32_t threads) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx     = n_ctx;
    cp.n_batch   = n_batch;
    cp.n_ubatch  = n_batch;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    return cp;
}

// --flash-attn on|off (anything else: off) and --cache-type for K and V alike
inline void set_attention(llama_context_params & cp, const std::string & flash_attn, const std::string & cache_type) {
    cp.flash_attn_type = flash_attn == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if      (cache_type == "f16")  cp.type_k = GGML_TYPE_F16;
    else if (cache_type == "f32")  cp.type_k = GGML_TYPE_F32;
    else if (cache_type == "bf16") cp.type_k = GGML_TYPE_BF16;
    else if (cache_type == "q8_0") cp.type_k = GGML_TYPE_Q8_0;
    else die("unsupported --cache-type " + cache_type + " (f16, f32, bf16, q8_0)");
    cp.type_v = cp.type_k;   // MLA requires equal K and V cache types
}

// a token at position p (logits: an output row); *idx, where given, gets what the add returned
inline bool add_token(llama_batch_ext * b, llama_token id, llama_pos p, bool logits, int32_t * idx = nullptr) {
    const int32_t i = llama_batch_ext_add_token(b, 0, id);
    if (idx) {
        *idx = i;
    }
    return i >= 0 && llama_batch_ext_set_pos(b, i, &p) && llama_batch_ext_set_output_logits(b, i, logits);
}

// a feature row (no output) at p, with 4-entry positions (M-RoPE layout, first entry used otherwise)
inline bool add_row(llama_batch_ext * b, const float * row, size_t width, llama_pos p, int32_t * idx = nullptr) {
    const llama_pos pos[4] = { p, p, p, 0 };
    const int32_t i = llama_batch_ext_add_embd(b, 0, { row, 1, width });
    if (idx) {
        *idx = i;
    }
    return i >= 0 && llama_batch_ext_set_pos(b, i, pos) && llama_batch_ext_set_output_embd(b, i, false);
}

inline std::string meta_str(const llama_model * model, const char * key, const char * fallback = "") {
    char buf[256] = {};
    return llama_model_meta_val_str(model, key, buf, sizeof(buf)) >= 0 ? std::string(buf) : std::string(fallback);
}

// "4,8,15" as ids (every item a number: an empty one is an error)
inline std::vector<int32_t> parse_ids(const std::string & s) {
    std::vector<int32_t> ids;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        ids.push_back((int32_t) std::stol(item));
    }
    return ids;
}

// token ids: an int .npy or a comma-separated list
inline std::vector<llama_token> read_tokens(const std::string & s) {
    if (s.size() > 4 && s.substr(s.size() - 4) == ".npy") {
        const npy_array a = npy_load(s);
        std::vector<llama_token> ids;
        for (int64_t i = 0; i < a.size(); ++i) {
            ids.push_back(a.at<llama_token>(i));
        }
        return ids;
    }
    return parse_ids(s);
}

// s inside a JSON string: quotes, backslashes and newlines escaped
inline std::string json_escape(const std::string & s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
        }
        o += c == '\n' ? std::string("\\n") : std::string(1, c);
    }
    return o;
}
