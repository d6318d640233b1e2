// Model placement shared by the proof programs (--draft-devices / --target-devices): a
// comma-separated list of llama.cpp device names (CUDA0, RPC0, ...; CPU or none: the host)
// becomes a NULL-terminated llama_model_params.devices list with every layer offloaded to it.
#pragma once

#include "llama.h"
#include "ggml-backend.h"

#include "diag.h"

#include <sstream>
#include <string>
#include <vector>

inline std::vector<std::string> split_list(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) {
            out.push_back(item);
        }
    }
    return out;
}

// "1,3,7" as ints (empty items skipped)
inline std::vector<int> parse_ints(const std::string & s) {
    std::vector<int> v;
    for (const std::string & item : split_list(s)) {
        v.push_back(std::stoi(item));
    }
    return v;
}

// a NULL-terminated device list for llama_model_params.devices (empty: the CPU only)
inline std::vector<ggml_backend_dev_t> parse_devices(const std::string & names) {
    std::vector<ggml_backend_dev_t> devs;
    for (const std::string & name : split_list(names)) {
        if (name == "CPU" || name == "none") {
            continue;
        }
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (!dev) {
            std::string known;
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
                known += std::string(known.empty() ? "" : ", ") + ggml_backend_dev_name(ggml_backend_dev_get(i));
            }
            die("unknown device " + name + " (this run has: " + known + "; RPC devices come with --rpc)");
        }
        devs.push_back(dev);
    }
    devs.push_back(nullptr);
    return devs;
}

inline llama_model_params placed_params(const std::vector<ggml_backend_dev_t> & devs) {
    llama_model_params mparams = llama_model_default_params();
    mparams.devices      = const_cast<ggml_backend_dev_t *>(devs.data());
    mparams.n_gpu_layers = devs.size() > 1 ? 999 : 0;   // every layer on the devices given, else the CPU
    return mparams;
}
