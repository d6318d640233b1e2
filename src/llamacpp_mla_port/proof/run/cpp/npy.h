// Minimal .npy reading and writing (version 1.0, little-endian, C order) for the proof
// programs: enough for 1-D/2-D float32/float64/int32/int64 arrays, nothing more.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

struct npy_array {
    std::string          descr;  // "<f4", "<f8", "<i4", "<i8"
    std::vector<int64_t> shape;
    std::vector<char>    data;

    int64_t size() const {
        int64_t n = 1;
        for (int64_t d : shape) {
            n *= d;
        }
        return n;
    }

    template <typename T> T at(int64_t i) const {
        if (descr == "<f4") { float   v; std::memcpy(&v, data.data() + 4*i, 4); return (T) v; }
        if (descr == "<f8") { double  v; std::memcpy(&v, data.data() + 8*i, 8); return (T) v; }
        if (descr == "<i4") { int32_t v; std::memcpy(&v, data.data() + 4*i, 4); return (T) v; }
        if (descr == "<i8") { int64_t v; std::memcpy(&v, data.data() + 8*i, 8); return (T) v; }
        throw std::runtime_error("unsupported npy dtype " + descr);
    }
};

static std::string npy_header_value(const std::string & header, const std::string & key) {
    const size_t k = header.find("'" + key + "'");
    if (k == std::string::npos) {
        throw std::runtime_error("npy header has no '" + key + "'");
    }
    size_t v = header.find(':', k) + 1;
    while (v < header.size() && header[v] == ' ') {
        v++;
    }
    size_t end = v;
    if (header[v] == '(') {
        end = header.find(')', v) + 1;
    } else if (header[v] == '\'') {
        end = header.find('\'', v + 1) + 1;
    } else {
        while (end < header.size() && header[end] != ',' && header[end] != '}') {
            end++;
        }
    }
    return header.substr(v, end - v);
}

static npy_array npy_load(const std::string & path) {
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) {
        throw std::runtime_error("cannot open " + path);
    }
    char magic[8];
    if (std::fread(magic, 1, 8, f) != 8 || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
        std::fclose(f);
        throw std::runtime_error(path + ": not a .npy file");
    }
    uint32_t header_len = 0;
    if (magic[6] == 1) {
        uint16_t h16 = 0;
        if (std::fread(&h16, 2, 1, f) != 1) { std::fclose(f); throw std::runtime_error(path + ": truncated"); }
        header_len = h16;
    } else {
        if (std::fread(&header_len, 4, 1, f) != 1) { std::fclose(f); throw std::runtime_error(path + ": truncated"); }
    }
    std::string header(header_len, ' ');
    if (std::fread(header.data(), 1, header_len, f) != header_len) {
        std::fclose(f);
        throw std::runtime_error(path + ": truncated header");
    }
    npy_array a;
    std::string descr = npy_header_value(header, "descr");
    a.descr = descr.substr(1, descr.size() - 2);
    if (a.descr == "|i1" || a.descr == "|u1" || a.descr.empty() || a.descr[0] == '>') {
        std::fclose(f);
        throw std::runtime_error(path + ": unsupported dtype " + a.descr + " (need <f4, <f8, <i4 or <i8)");
    }
    if (npy_header_value(header, "fortran_order") != "False") {
        std::fclose(f);
        throw std::runtime_error(path + ": Fortran-ordered arrays are not supported");
    }
    const std::string shape = npy_header_value(header, "shape");
    for (size_t i = 1; i < shape.size();) {
        while (i < shape.size() && (shape[i] == ' ' || shape[i] == ',')) {
            i++;
        }
        if (i >= shape.size() || shape[i] == ')') {
            break;
        }
        size_t used = 0;
        a.shape.push_back(std::stoll(shape.substr(i), &used));
        i += used;
    }
    const size_t item = (a.descr == "<f8" || a.descr == "<i8") ? 8 : 4;
    a.data.resize((size_t) a.size() * item);
    if (std::fread(a.data.data(), 1, a.data.size(), f) != a.data.size()) {
        std::fclose(f);
        throw std::runtime_error(path + ": truncated data");
    }
    std::fclose(f);
    return a;
}

static void npy_save(const std::string & path, const std::string & descr, const std::vector<int64_t> & shape,
                     const void * data, size_t nbytes) {
    std::string shp = "(";
    for (size_t i = 0; i < shape.size(); ++i) {
        shp += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
        if (i + 1 < shape.size()) {
            shp += " ";
        }
    }
    shp += ")";
    std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shp + ", }";
    const size_t total = 10 + header.size() + 1;
    header += std::string((64 - total % 64) % 64, ' ') + "\n";
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) {
        throw std::runtime_error("cannot write " + path);
    }
    const uint16_t hlen = (uint16_t) header.size();
    std::fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    std::fwrite(&hlen, 2, 1, f);
    std::fwrite(header.data(), 1, header.size(), f);
    std::fwrite(data, 1, nbytes, f);
    std::fclose(f);
}
