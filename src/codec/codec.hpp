// The segment codec: frames, the zstd envelope around them, and the txn hash.
//
// A segment is K frames concatenated and compressed together (zstd level 3; a segment of
// fewer than kSegmentSmallBytes of frames at zstd's fastest level, -1: see
// segment_zstd_level and docs/decisions/0022-small-segments-fast-level.md). A frame is
// little-endian: u32 body length, then the body: u8 flags, 16-byte message id, [16-byte trace
// id if flags & 1], u16 txn length, txn, [u16 producer-sub length, producer sub if flags & 2],
// payload (the rest of the body). Beside the blob, `hashes` carries the xxh3-128 of each
// frame's txn, 16 bytes big-endian, in frame order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qsw {

inline constexpr uint8_t kFrameTraceId = 1;
inline constexpr uint8_t kFrameProducerSub = 2;
inline constexpr uint8_t kFrameEncrypted = 4;
inline constexpr uint8_t kFrameKnownFlags = kFrameTraceId | kFrameProducerSub | kFrameEncrypted;

inline constexpr size_t kUuidBytes = 16;
inline constexpr size_t kTxnHashBytes = 16;
// Both lengths travel as u16 in the frame.
inline constexpr size_t kMaxTxnBytes = 65535;
inline constexpr size_t kMaxProducerSubBytes = 65535;
inline constexpr int kSegmentZstdLevel = 3;
// Below this many bytes of frames a segment is compressed at kSegmentSmallZstdLevel: at a
// frame or two, level 3 saves 5-20% of a few hundred bytes and costs 4-5 times the CPU
// (its entropy stage), which at a segment per timer was the largest cost of the sweeper's
// own process. Any zstd decoder reads both.
inline constexpr size_t kSegmentSmallBytes = 512;
inline constexpr int kSegmentSmallZstdLevel = -1;
// The zstd level a segment of `frames_bytes` bytes of frames is compressed at.
constexpr int segment_zstd_level(size_t frames_bytes) {
    return frames_bytes < kSegmentSmallBytes ? kSegmentSmallZstdLevel : kSegmentZstdLevel;
}
// A blob whose decompressed size would pass this is refused: a few bytes of zstd can
// declare (or stream) gigabytes, and the decoder must not be the host's OOM.
inline constexpr size_t kMaxDecompressedBytes = size_t{256} << 20;

// One frame. For append_frame the pointers are the caller's; for a decoded segment they
// point into DecodedSegment::raw and live as long as it does.
struct FrameView {
    uint8_t flags = 0;
    const uint8_t *message_id = nullptr;  // 16 bytes
    const uint8_t *trace_id = nullptr;    // 16 bytes, or null when flags & 1 is clear
    std::string_view txn;
    std::optional<std::string_view> producer_sub;  // set exactly when flags & 2
    std::string_view payload;
};

// Bytes append_frame would add for this frame, the 4-byte length prefix included.
// Throws std::length_error when the txn or producer sub passes 65535 bytes or the body
// passes u32, std::invalid_argument when flags disagree with the fields (see append_frame).
size_t frame_size(const FrameView &frame);

// Appends one frame to `out`. Flags 1 and 2 must match trace_id and producer_sub being
// present; unknown bits are refused, so a frame can always be read back as it was meant.
// Throws as frame_size; `out` is untouched when it throws.
void append_frame(std::string &out, const FrameView &frame);

// zstd of concatenated frames, at segment_zstd_level(frames.size()); one zstd frame with
// its content size declared.
// Throws std::runtime_error if zstd fails (only on allocation failure in practice).
std::string compress_segment(std::string_view frames);

// Decompresses any zstd input (one or more frames, content size declared or not) into
// `out`, refusing more than `ceiling` bytes of output. On failure returns false and says
// what in `error`.
bool zstd_decompress(const uint8_t *src, size_t len, std::string &out, std::string &error,
                     size_t ceiling = kMaxDecompressedBytes);

// xxh3-128 of the txn bytes, big-endian: high 64 bits first, then low 64 bits.
void txn_hash(std::string_view txn, uint8_t out[kTxnHashBytes]);
void append_txn_hash(std::string &out, std::string_view txn);

// A decoded segment owns its decompressed bytes; the frames are views into them. A vector
// keeps its buffer when moved, so the views survive a move; copying is refused because the
// copy's views would still point into the original.
struct DecodedSegment {
    std::vector<uint8_t> raw;
    std::vector<FrameView> frames;

    DecodedSegment() = default;
    DecodedSegment(DecodedSegment &&) noexcept = default;
    DecodedSegment &operator=(DecodedSegment &&) noexcept = default;
    DecodedSegment(const DecodedSegment &) = delete;
    DecodedSegment &operator=(const DecodedSegment &) = delete;
};

// Parses already-decompressed frames. Views point into [data, data + len). Refuses an empty
// buffer, a truncated length prefix, a body, txn or producer sub running past its end, and
// unknown flag bits, with a message naming the frame and the byte offset. Never reads past
// data + len. On failure `out` is left empty.
bool parse_frames(const uint8_t *data, size_t len, std::vector<FrameView> &out,
                  std::string &error);

// Decompresses and parses a blob. On failure returns false, `out` is left empty and `error`
// says what and where (offsets into the decompressed bytes for frame errors).
bool decode_segment(const uint8_t *blob, size_t len, DecodedSegment &out, std::string &error);

// PostgreSQL's uuid text forms: 32 hex digits, either case, a hyphen allowed after any group
// of four digits, optionally wrapped in braces.
bool parse_uuid(std::string_view text, uint8_t out[kUuidBytes]);
// The canonical lower-case 8-4-4-4-12 form PostgreSQL prints.
std::string format_uuid(const uint8_t *uuid);

}  // namespace qsw
