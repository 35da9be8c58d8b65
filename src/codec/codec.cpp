#include "codec/codec.hpp"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>

namespace qsw {
namespace {

// flags + message id + txn length: the smallest body a frame can have.
constexpr size_t kMinBodyBytes = 1 + kUuidBytes + 2;

void put_u16le(std::string &out, size_t v) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>((v >> 8) & 0xff));
}

void put_u32le(std::string &out, size_t v) {
    for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}

uint32_t get_u32le(const uint8_t *p) {
    return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}

uint16_t get_u16le(const uint8_t *p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

void put_u64be(uint8_t *out, uint64_t v) {
    for (int i = 7; i >= 0; --i) {
        out[i] = static_cast<uint8_t>(v & 0xff);
        v >>= 8;
    }
}

// Body bytes without the length prefix; validates everything append_frame relies on.
size_t body_size(const FrameView &frame) {
    if (frame.flags & ~kFrameKnownFlags)
        throw std::invalid_argument("frame flags have unknown bits: " + std::to_string(frame.flags));
    if (((frame.flags & kFrameTraceId) != 0) != (frame.trace_id != nullptr))
        throw std::invalid_argument("frame flag 1 must be set exactly when a trace id is given");
    if (((frame.flags & kFrameProducerSub) != 0) != frame.producer_sub.has_value())
        throw std::invalid_argument("frame flag 2 must be set exactly when a producer sub is given");
    if (frame.message_id == nullptr) throw std::invalid_argument("frame has no message id");
    if (frame.txn.size() > kMaxTxnBytes)
        throw std::length_error("txn is " + std::to_string(frame.txn.size()) +
                                " bytes, over the 65535-byte frame limit");
    if (frame.producer_sub && frame.producer_sub->size() > kMaxProducerSubBytes)
        throw std::length_error("producer sub is " + std::to_string(frame.producer_sub->size()) +
                                " bytes, over the 65535-byte frame limit");
    size_t fixed = kMinBodyBytes + frame.txn.size();
    if (frame.trace_id) fixed += kUuidBytes;
    if (frame.producer_sub) fixed += 2 + frame.producer_sub->size();
    constexpr size_t kMaxBody = std::numeric_limits<uint32_t>::max();
    if (frame.payload.size() > kMaxBody - fixed)
        throw std::length_error("frame body of " + std::to_string(fixed) + " + " +
                                std::to_string(frame.payload.size()) +
                                " payload bytes does not fit its u32 length");
    return fixed + frame.payload.size();
}

struct DctxDeleter {
    void operator()(ZSTD_DCtx *d) const { ZSTD_freeDCtx(d); }
};

std::string zstd_error(const char *what, size_t code) {
    return std::string("bad zstd: ") + what + ": " + ZSTD_getErrorName(code);
}

// Used when a size is not declared, the input holds several zstd frames, or the declared size
// is implausible for the input: the output grows with what is actually produced, so a lying
// header cannot make us zero-fill hundreds of megabytes before the lie shows.
template <typename Buffer>
bool decompress_streaming(const uint8_t *src, size_t len, Buffer &out, std::string &error,
                          size_t ceiling) {
    std::unique_ptr<ZSTD_DCtx, DctxDeleter> dctx(ZSTD_createDCtx());
    if (!dctx) throw std::bad_alloc();
    // zstd's default window limit (128 MiB) would refuse a legitimate segment between it and
    // the ceiling; the ceiling, not zstd's default, is the one limit this decoder applies.
    int window_log = 27;  // zstd's ZSTD_WINDOWLOG_LIMIT_DEFAULT, outside its stable API
    while (window_log < 31 && (size_t{1} << window_log) < ceiling) ++window_log;
    ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_windowLogMax, window_log);
    out.clear();
    // One byte beyond the ceiling is room enough to notice that it was passed.
    const size_t hard_cap = ceiling == std::numeric_limits<size_t>::max() ? ceiling : ceiling + 1;
    const size_t guess = len > hard_cap / 4 ? hard_cap : len * 4;
    size_t capacity = std::min(std::max<size_t>(ZSTD_DStreamOutSize(), guess), hard_cap);
    out.resize(capacity);
    ZSTD_inBuffer in{src, len, 0};
    ZSTD_outBuffer ob{out.data(), out.size(), 0};
    size_t last = 0;
    for (;;) {
        if (ob.pos == ob.size) {
            if (ob.size >= hard_cap) break;
            size_t grown = ob.size > hard_cap / 2 ? hard_cap : ob.size * 2;
            out.resize(grown);
            ob.dst = out.data();
            ob.size = out.size();
        }
        last = ZSTD_decompressStream(dctx.get(), &ob, &in);
        if (ZSTD_isError(last)) {
            error = zstd_error("decompression failed", last);
            out.clear();
            return false;
        }
        if (in.pos == in.size && last == 0) break;
        // Input is used up, output had room, and the decoder still wants more: truncated.
        if (in.pos == in.size && ob.pos < ob.size) {
            error = "bad zstd: truncated: input ends at byte " + std::to_string(len) +
                    " inside a zstd frame";
            out.clear();
            return false;
        }
    }
    if (ob.pos > ceiling) {
        error = "bad zstd: decompresses to more than the " + std::to_string(ceiling) +
                "-byte ceiling";
        out.clear();
        return false;
    }
    out.resize(ob.pos);
    return true;
}

bool fail(std::string &error, size_t frame_index, size_t frame_start, const std::string &message) {
    error = "segment corrupt: frame " + std::to_string(frame_index) + " at byte " +
            std::to_string(frame_start) + ": " + message;
    return false;
}

template <typename Buffer>
bool decompress_into(const uint8_t *src, size_t len, Buffer &out, std::string &error,
                     size_t ceiling) {
    out.clear();
    if (len == 0) {
        error = "bad zstd: empty input";
        return false;
    }
    // Walk the zstd frames first: a header that declares more than the ceiling is refused
    // before anything is allocated, and a truncated frame is named by its offset.
    size_t frames = 0;
    bool all_declared = true;
    unsigned long long declared = 0;
    for (size_t pos = 0; pos < len; ++frames) {
        const unsigned long long size = ZSTD_getFrameContentSize(src + pos, len - pos);
        if (size == ZSTD_CONTENTSIZE_ERROR) {
            error = "bad zstd: no valid zstd frame header at byte " + std::to_string(pos);
            return false;
        }
        const size_t compressed = ZSTD_findFrameCompressedSize(src + pos, len - pos);
        if (ZSTD_isError(compressed)) {
            error = zstd_error(("truncated or malformed frame at byte " + std::to_string(pos)).c_str(),
                               compressed);
            return false;
        }
        if (size == ZSTD_CONTENTSIZE_UNKNOWN) {
            all_declared = false;
        } else {
            declared += std::min<unsigned long long>(size, ceiling + 1ull);
            if (declared > ceiling) {
                error = "bad zstd: frame at byte " + std::to_string(pos) + " declares " +
                        std::to_string(size) + " decompressed bytes" +
                        (pos > 0 ? ", with the frames before it" : "") + " over the " +
                        std::to_string(ceiling) + "-byte ceiling";
                return false;
            }
        }
        pos += compressed;
    }
    // One shot only for a single frame that states a size its input could plausibly hold;
    // anything else (unknown size, several frames, a header claiming a ratio no real segment
    // has) streams, growing only with what is really produced.
    const bool plausible = declared <= static_cast<unsigned long long>(len) * 1024 + (64u << 10);
    if (frames == 1 && all_declared && plausible) {
        out.resize(static_cast<size_t>(declared));
        const size_t n = ZSTD_decompress(out.data(), out.size(), src, len);
        if (ZSTD_isError(n)) {
            out.clear();
            error = zstd_error("decompression failed", n);
            return false;
        }
        if (n == declared) return true;
    } else if (decompress_streaming(src, len, out, error, ceiling)) {
        if (!all_declared || out.size() == declared) return true;
    } else {
        return false;
    }
    error = "bad zstd: frames declare " + std::to_string(declared) + " bytes but hold " +
            std::to_string(out.size());
    out.clear();
    return false;
}

}  // namespace

size_t frame_size(const FrameView &frame) { return 4 + body_size(frame); }

void append_frame(std::string &out, const FrameView &frame) {
    const size_t body = body_size(frame);
    out.reserve(out.size() + 4 + body);
    put_u32le(out, body);
    out.push_back(static_cast<char>(frame.flags));
    out.append(reinterpret_cast<const char *>(frame.message_id), kUuidBytes);
    if (frame.trace_id) out.append(reinterpret_cast<const char *>(frame.trace_id), kUuidBytes);
    put_u16le(out, frame.txn.size());
    out.append(frame.txn);
    if (frame.producer_sub) {
        put_u16le(out, frame.producer_sub->size());
        out.append(*frame.producer_sub);
    }
    out.append(frame.payload);
}

// One compression context per thread, kept: ZSTD_compress would create (allocate and
// initialise some hundreds of KiB of tables) and free one for every segment, which on a
// drain of small segments costs more than the compression itself. Same level, same
// bytes out.
static ZSTD_CCtx *segment_cctx() {
    struct Owned {
        ZSTD_CCtx *cctx = ZSTD_createCCtx();
        ~Owned() { ZSTD_freeCCtx(cctx); }
    };
    thread_local Owned owned;
    if (owned.cctx == nullptr) throw std::bad_alloc();
    return owned.cctx;
}

std::string compress_segment(std::string_view frames) {
    std::string out;
    out.resize(ZSTD_compressBound(frames.size()));
    const size_t n = ZSTD_compressCCtx(segment_cctx(), out.data(), out.size(), frames.data(), frames.size(),
                                       segment_zstd_level(frames.size()));
    if (ZSTD_isError(n)) throw std::runtime_error(std::string("zstd: ") + ZSTD_getErrorName(n));
    out.resize(n);
    return out;
}

bool zstd_decompress(const uint8_t *src, size_t len, std::string &out, std::string &error,
                     size_t ceiling) {
    return decompress_into(src, len, out, error, ceiling);
}

void txn_hash(std::string_view txn, uint8_t out[kTxnHashBytes]) {
    const XXH128_hash_t h = XXH3_128bits(txn.data(), txn.size());
    put_u64be(out, h.high64);
    put_u64be(out + 8, h.low64);
}

void append_txn_hash(std::string &out, std::string_view txn) {
    uint8_t h[kTxnHashBytes];
    txn_hash(txn, h);
    out.append(reinterpret_cast<const char *>(h), kTxnHashBytes);
}

// One frame's body, bytes [pos, end) of the segment (end already checked to lie inside it):
// the flags, the ids, the txn, the producer sub and the payload. index and start (where the
// frame's length begins) name the frame in an error.
static bool parse_frame_body(const uint8_t *data, size_t index, size_t start, size_t pos, size_t end,
                             FrameView &f, std::string &error) {
    // Every read below is bounded by `end`, which the caller kept inside the buffer.
    auto short_of = [&](size_t need, const char *what) -> bool {
        if (end - pos >= need) return false;
        fail(error, index, start,
             std::string(what) + " at byte " + std::to_string(pos) + " needs " +
                 std::to_string(need) + (need == 1 ? " byte" : " bytes") +
                 " but the body ends at byte " +
                 std::to_string(end));
        return true;
    };
    if (short_of(1, "flags")) return false;
    f.flags = data[pos];
    if (f.flags & ~kFrameKnownFlags) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", f.flags);
        return fail(error, index, start,
                    std::string("flags ") + hex + " at byte " + std::to_string(pos) +
                        " have unknown bits");
    }
    pos += 1;
    if (short_of(kUuidBytes, "message id")) return false;
    f.message_id = data + pos;
    pos += kUuidBytes;
    if (f.flags & kFrameTraceId) {
        if (short_of(kUuidBytes, "trace id")) return false;
        f.trace_id = data + pos;
        pos += kUuidBytes;
    }
    if (short_of(2, "txn length")) return false;
    const size_t txn_len = get_u16le(data + pos);
    if (txn_len > end - pos - 2)
        return fail(error, index, start,
                    "txn length " + std::to_string(txn_len) + " at byte " +
                        std::to_string(pos) + " runs past the end of the body at byte " +
                        std::to_string(end));
    pos += 2;
    f.txn = std::string_view(reinterpret_cast<const char *>(data + pos), txn_len);
    pos += txn_len;
    if (f.flags & kFrameProducerSub) {
        if (short_of(2, "producer-sub length")) return false;
        const size_t sub_len = get_u16le(data + pos);
        if (sub_len > end - pos - 2)
            return fail(error, index, start,
                        "producer-sub length " + std::to_string(sub_len) + " at byte " +
                            std::to_string(pos) + " runs past the end of the body at byte " +
                            std::to_string(end));
        pos += 2;
        f.producer_sub = std::string_view(reinterpret_cast<const char *>(data + pos), sub_len);
        pos += sub_len;
    }
    f.payload = std::string_view(reinterpret_cast<const char *>(data + pos), end - pos);
    return true;
}

bool parse_frames(const uint8_t *data, size_t len, std::vector<FrameView> &out,
                  std::string &error) {
    out.clear();
    if (len == 0) {
        error = "segment corrupt: empty segment (no frames)";
        return false;
    }
    std::vector<FrameView> frames;
    size_t pos = 0;
    for (size_t index = 0; pos < len; ++index) {
        const size_t start = pos;
        if (len - pos < 4)
            return fail(error, index, start,
                        "body length truncated: " + std::to_string(len - pos) +
                            " of 4 bytes before the segment ends at byte " + std::to_string(len));
        const uint32_t body_len = get_u32le(data + pos);
        pos += 4;
        if (body_len > len - pos)
            return fail(error, index, start,
                        "body length " + std::to_string(body_len) +
                            " runs past the end of the segment (body would end at byte " +
                            std::to_string(pos + size_t{body_len}) + ", segment ends at byte " +
                            std::to_string(len) + ")");
        const size_t end = pos + body_len;
        FrameView f;
        if (!parse_frame_body(data, index, start, pos, end, f, error)) return false;
        pos = end;
        frames.push_back(f);
    }
    out = std::move(frames);
    return true;
}

bool decode_segment(const uint8_t *blob, size_t len, DecodedSegment &out, std::string &error) {
    out.raw.clear();
    out.frames.clear();
    DecodedSegment decoded;
    if (!decompress_into(blob, len, decoded.raw, error, kMaxDecompressedBytes)) {
        error = "segment corrupt: " + error;
        return false;
    }
    if (!parse_frames(decoded.raw.data(), decoded.raw.size(), decoded.frames, error)) return false;
    out = std::move(decoded);
    return true;
}

bool parse_uuid(std::string_view text, uint8_t out[kUuidBytes]) {
    if (text.size() >= 2 && text.front() == '{' && text.back() == '}')
        text = text.substr(1, text.size() - 2);
    auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    uint8_t bytes[kUuidBytes];
    size_t pos = 0;
    for (size_t i = 0; i < kUuidBytes; ++i) {
        // PostgreSQL accepts a hyphen after any group of four digits, never at the start.
        if (i > 0 && i % 2 == 0 && pos < text.size() && text[pos] == '-') ++pos;
        if (text.size() - pos < 2) return false;
        const int hi = nibble(text[pos]);
        const int lo = nibble(text[pos + 1]);
        if (hi < 0 || lo < 0) return false;
        bytes[i] = static_cast<uint8_t>((hi << 4) | lo);
        pos += 2;
    }
    if (pos != text.size()) return false;
    std::memcpy(out, bytes, kUuidBytes);
    return true;
}

std::string format_uuid(const uint8_t *uuid) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string s;
    s.reserve(36);
    for (size_t i = 0; i < kUuidBytes; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
        s.push_back(kHex[uuid[i] >> 4]);
        s.push_back(kHex[uuid[i] & 0xf]);
    }
    return s;
}

}  // namespace qsw
