// Graph tensors by name, shared by the proof programs (--dump NAME,...): the eval-callback
// mechanism of examples/eval-callback. Every computed node whose name is in the set is
// copied as F32 rows [ne1*ne2*ne3, ne0]; save() writes them as out/dump-NAME.npy and stops
// with the names the graph did have when one was never computed.
#pragma once

#include "ggml.h"
#include "ggml-backend.h"
#include "llama.h"

#include "devices.h"
#include "diag.h"
#include "npy.h"

#include <map>
#include <set>
#include <string>
#include <vector>

struct dump_state {
    std::set<std::string>                       names;
    std::map<std::string, std::vector<float>>   data;
    std::map<std::string, std::vector<int64_t>> shape;
    std::set<std::string>                       seen;
    bool                                        active = true;   // the caller turns it off after the decodes it wants

    void watch(const std::string & list, llama_context_params & cp);

    void save(const std::string & out) {
        for (const auto & name : names) {
            if (!data.count(name)) {
                std::string all;
                for (const auto & n : seen) {
                    all += " " + n;
                }
                die("--dump " + name + ": no tensor of that name was computed; the graph has:" + all);
            }
            const auto & buf = data[name];
            npy_save(out + "/dump-" + name + ".npy", "<f4", shape[name], buf.data(), buf.size() * sizeof(float));
        }
    }
};

// a node of a later decode with the same name replaces the earlier copy
inline bool dump_cb(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * st = (dump_state *) user_data;
    const bool wanted = st->active && st->names.count(ggml_get_name(t)) > 0;
    if (ask) {
        st->seen.insert(ggml_get_name(t));
        return wanted;
    }
    if (wanted) {
        if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
            die(std::string("--dump ") + ggml_get_name(t) + ": not a contiguous F32 tensor");
        }
        auto & buf = st->data[ggml_get_name(t)];
        buf.resize((size_t) ggml_nelements(t));
        ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
        st->shape[ggml_get_name(t)] = { t->ne[1] * t->ne[2] * t->ne[3], t->ne[0] };
    }
    return true;
}

// the names of a --dump list; with any, cp's eval callback records them into this state
inline void dump_state::watch(const std::string & list, llama_context_params & cp) {
    for (const std::string & name : split_list(list)) {
        names.insert(name);
    }
    if (!names.empty()) {
        cp.cb_eval           = dump_cb;
        cp.cb_eval_user_data = this;
    }
}
