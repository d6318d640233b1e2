// Diagnostics shared by the proof programs: llama.cpp's log is captured (shown live with
// --verbose) and replayed before a fatal error, whose message comes last: callers read the tail.
#pragma once

#include "ggml.h"

#include <cstdio>
#include <cstdlib>
#include <string>

inline std::string  g_log;
inline bool         g_verbose = false;
inline const char * g_prog    = "proof";

inline void log_cb(ggml_log_level level, const char * text, void * /*user*/) {
    g_log += text;
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

[[noreturn]] inline void die(const std::string & msg) {
    if (!g_verbose && !g_log.empty()) {
        std::fprintf(stderr, "--- llama.cpp log (last 2000 chars) ---\n%s\n---\n",
                     g_log.substr(g_log.size() > 2000 ? g_log.size() - 2000 : 0).c_str());
    }
    std::fprintf(stderr, "%s: error: %s\n", g_prog, msg.c_str());
    std::exit(1);
}
