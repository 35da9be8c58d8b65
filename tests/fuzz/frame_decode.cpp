// libFuzzer target: already-decompressed frame bytes through qsw::parse_frames. The frame
// layout has exactly one encoding, so whatever parses must re-encode (append_frame) to the
// very bytes it came from, and whatever is refused leaves no frames and says why.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::vector<qsw::FrameView> frames;
    std::string error;
    if (!qsw::parse_frames(data, size, frames, error)) {
        QSW_FUZZ_CHECK(frames.empty(), "a refused buffer left frames behind");
        QSW_FUZZ_CHECK(!error.empty(), "refused without a message");
        return 0;
    }
    QSW_FUZZ_CHECK(!frames.empty(), "parsed to zero frames");
    const auto *lo = reinterpret_cast<const char *>(data);
    const auto *hi = lo + size;
    std::string again;
    for (const auto &f : frames) {
        // Views must stay inside the input: a view past it would be a read overflow later.
        QSW_FUZZ_CHECK(f.txn.data() >= lo && f.txn.data() + f.txn.size() <= hi, "txn view");
        QSW_FUZZ_CHECK(f.payload.data() >= lo && f.payload.data() + f.payload.size() <= hi,
                       "payload view");
        QSW_FUZZ_CHECK(f.txn.size() <= qsw::kMaxTxnBytes, "txn over the u16 limit");
        QSW_FUZZ_CHECK(qsw::frame_size(f) >= 4 + 1 + qsw::kUuidBytes + 2, "frame size");
        qsw::append_frame(again, f);
    }
    QSW_FUZZ_CHECK(again.size() == size && std::memcmp(again.data(), data, size) == 0,
                   "parse + append_frame is not the identity");
    return 0;
}
