// Clocks and sample lists shared by the timing programs (draft-bench, verify-bench, ggml-floor).
#pragma once

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

// wall time, monotonic
inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the whole process: over a timed pass, / (wall x threads) near 1 means the
// threads had the cores; well below, other processes took them and the time is not ours
inline double cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// timed samples as a JSON list, 6 significant digits each (or as fmt writes them)
inline std::string json_samples(const std::vector<double> & v, const char * fmt = "%.6g") {
    std::string o = "[";
    for (size_t i = 0; i < v.size(); ++i) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), fmt, v[i]);
        o += (i ? "," : "") + std::string(buf);
    }
    return o + "]";
}
