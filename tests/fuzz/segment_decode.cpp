// libFuzzer target: a packed segment blob as read from queen.log_segments.blob, decoded by
// qsw::decode_segment and by the C ABI (queen_sweeper_segment_decode). Beyond "no crash":
// both paths agree, and a decoded segment survives re-encoding (frames -> compress ->
// decode gives the same frames), which is what the fire and every reader rely on.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "codec/codec.hpp"
#include "fuzz_util.hpp"
#include "queen_sweeper.h"

namespace {

bool same_frame(const qsw::FrameView &a, const qsw::FrameView &b) {
    if (a.flags != b.flags || a.txn != b.txn || a.payload != b.payload) return false;
    if (std::memcmp(a.message_id, b.message_id, qsw::kUuidBytes) != 0) return false;
    if ((a.trace_id == nullptr) != (b.trace_id == nullptr)) return false;
    if (a.trace_id && std::memcmp(a.trace_id, b.trace_id, qsw::kUuidBytes) != 0) return false;
    return a.producer_sub == b.producer_sub;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    qsw::DecodedSegment seg;
    std::string error;
    const bool ok = qsw::decode_segment(data, size, seg, error);

    queen_sweeper_segment *c = nullptr;
    const int rc = queen_sweeper_segment_decode(data, size, &c);
    QSW_FUZZ_CHECK((rc == QUEEN_SWEEPER_OK) == ok, "C ABI and decode_segment disagree: " + error);
    if (!ok) {
        QSW_FUZZ_CHECK(c == nullptr, "failed C decode left a segment");
        QSW_FUZZ_CHECK(rc == QUEEN_SWEEPER_ECORRUPT, "failed C decode is not ECORRUPT");
        QSW_FUZZ_CHECK(!error.empty(), "failed decode without an error message");
        QSW_FUZZ_CHECK(seg.frames.empty() && seg.raw.empty(), "failed decode left frames");
        return 0;
    }
    QSW_FUZZ_CHECK(queen_sweeper_segment_count(c) == seg.frames.size(), "frame counts differ");
    for (size_t i = 0; i < seg.frames.size(); ++i) {
        queen_sweeper_frame f{};
        f.struct_size = sizeof f;
        QSW_FUZZ_CHECK(queen_sweeper_segment_frame(c, i, &f) == QUEEN_SWEEPER_OK, "frame read");
        const auto &v = seg.frames[i];
        QSW_FUZZ_CHECK(f.flags == v.flags && f.txn_len == v.txn.size() &&
                           f.payload_len == v.payload.size() &&
                           std::memcmp(f.txn, v.txn.data(), f.txn_len) == 0 &&
                           std::memcmp(f.payload, v.payload.data(), f.payload_len) == 0,
                       "C frame differs from decode_segment's, frame " + std::to_string(i));
        QSW_FUZZ_CHECK((f.producer_sub != nullptr) == v.producer_sub.has_value(),
                       "producer sub presence differs");
    }
    queen_sweeper_frame past{};
    past.struct_size = sizeof past;
    QSW_FUZZ_CHECK(queen_sweeper_segment_frame(c, seg.frames.size(), &past) ==
                       QUEEN_SWEEPER_EINVAL,
                   "an index past the end is not refused");
    queen_sweeper_segment_free(&c);
    QSW_FUZZ_CHECK(c == nullptr, "free did not clear the handle");

    // Round trip. Flag bit 4 (encrypted) has no field of its own, so it re-encodes as is.
    std::string frames;
    for (const auto &f : seg.frames) qsw::append_frame(frames, f);
    QSW_FUZZ_CHECK(frames.size() == seg.raw.size() &&
                       std::memcmp(frames.data(), seg.raw.data(), frames.size()) == 0,
                   "re-encoded frames differ from the decompressed bytes");
    const std::string blob = qsw::compress_segment(frames);
    qsw::DecodedSegment again;
    QSW_FUZZ_CHECK(qsw::decode_segment(reinterpret_cast<const uint8_t *>(blob.data()),
                                       blob.size(), again, error),
                   "re-encoded segment does not decode: " + error);
    QSW_FUZZ_CHECK(again.frames.size() == seg.frames.size(), "round trip changed the count");
    for (size_t i = 0; i < seg.frames.size(); ++i)
        QSW_FUZZ_CHECK(same_frame(seg.frames[i], again.frames[i]),
                       "round trip changed frame " + std::to_string(i));
    return 0;
}
