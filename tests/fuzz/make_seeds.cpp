// Writes the seed corpora (tests/fuzz/corpus/<target>/) from the real encoder, so the
// fuzzers start from valid segments and frames rather than having to discover zstd.
//   build-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "codec/codec.hpp"

namespace fs = std::filesystem;

namespace {

void put(const fs::path &dir, const std::string &name, const std::string &bytes) {
    fs::create_directories(dir);
    std::ofstream(dir / name, std::ios::binary).write(bytes.data(),
                                                      static_cast<std::streamsize>(bytes.size()));
}

std::string frames_of(int count, bool trace, bool sub, size_t payload_len, bool encrypted) {
    static const uint8_t id[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    static const uint8_t tr[16] = {0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    std::string out;
    for (int i = 0; i < count; ++i) {
        const std::string txn = "txn-" + std::to_string(i);
        const std::string payload(payload_len + static_cast<size_t>(i), static_cast<char>('a' + i % 26));
        qsw::FrameView f;
        f.flags = static_cast<uint8_t>((trace ? qsw::kFrameTraceId : 0) |
                                       (sub ? qsw::kFrameProducerSub : 0) |
                                       (encrypted ? qsw::kFrameEncrypted : 0));
        f.message_id = id;
        f.trace_id = trace ? tr : nullptr;
        f.txn = txn;
        if (sub) f.producer_sub = std::string_view("producer-7");
        f.payload = payload;
        qsw::append_frame(out, f);
    }
    return out;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    const fs::path root = argv[1];
    struct Shape {
        const char *name;
        int count;
        bool trace, sub;
        size_t payload;
        bool enc;
    };
    const std::vector<Shape> shapes = {
        {"one_plain", 1, false, false, 5, false},   {"one_trace", 1, true, false, 0, false},
        {"one_sub", 1, false, true, 12, false},     {"all_flags", 3, true, true, 40, true},
        {"many_small", 40, false, false, 1, false}, {"big_payload", 2, false, true, 3000, false},
    };
    for (const auto &s : shapes) {
        const std::string frames = frames_of(s.count, s.trace, s.sub, s.payload, s.enc);
        put(root / "frame_decode", s.name, frames);
        put(root / "segment_decode", s.name, qsw::compress_segment(frames));
    }
    std::printf("seeds written under %s\n", root.c_str());
    return 0;
}
