// The segment codec and its C entry points: what goes in comes out, and nothing corrupt gets
// past the decoder or makes it read outside its buffers.
#include <gtest/gtest.h>
#include <xxhash.h>
#include <zstd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "queen_sweeper.h"

#include "codec/codec.hpp"

namespace qs = qsw;

namespace {

struct OwnedFrame {
    uint8_t flags = 0;
    uint8_t message_id[16] = {};
    uint8_t trace_id[16] = {};
    bool has_trace = false;
    std::string txn;
    std::optional<std::string> producer_sub;
    std::string payload;

    qs::FrameView view() const {
        qs::FrameView v;
        v.flags = flags;
        v.message_id = message_id;
        v.trace_id = has_trace ? trace_id : nullptr;
        v.txn = txn;
        if (producer_sub) v.producer_sub = std::string_view(*producer_sub);
        v.payload = payload;
        return v;
    }
};

OwnedFrame make_frame(int seed, bool trace, bool sub, bool encrypted, std::string payload) {
    OwnedFrame f;
    for (int i = 0; i < 16; ++i) {
        f.message_id[i] = static_cast<uint8_t>(seed * 31 + i);
        f.trace_id[i] = static_cast<uint8_t>(seed * 17 + 200 + i);
    }
    f.has_trace = trace;
    f.txn = "txn-" + std::to_string(seed);
    if (sub) f.producer_sub = "sub-" + std::to_string(seed);
    f.payload = std::move(payload);
    f.flags = static_cast<uint8_t>((trace ? qs::kFrameTraceId : 0) |
                                   (sub ? qs::kFrameProducerSub : 0) |
                                   (encrypted ? qs::kFrameEncrypted : 0));
    return f;
}

std::string frames_of(const std::vector<OwnedFrame> &frames) {
    std::string raw;
    for (const auto &f : frames) qs::append_frame(raw, f.view());
    return raw;
}

const uint8_t *bytes(const std::string &s) { return reinterpret_cast<const uint8_t *>(s.data()); }

void expect_same(const OwnedFrame &want, const qs::FrameView &got) {
    EXPECT_EQ(got.flags, want.flags);
    EXPECT_EQ(0, std::memcmp(got.message_id, want.message_id, 16));
    if (want.has_trace) {
        ASSERT_NE(got.trace_id, nullptr);
        EXPECT_EQ(0, std::memcmp(got.trace_id, want.trace_id, 16));
    } else {
        EXPECT_EQ(got.trace_id, nullptr);
    }
    EXPECT_EQ(got.txn, want.txn);
    ASSERT_EQ(got.producer_sub.has_value(), want.producer_sub.has_value());
    if (want.producer_sub) {
        EXPECT_EQ(*got.producer_sub, *want.producer_sub);
    }
    EXPECT_EQ(got.payload, want.payload);
}

qs::DecodedSegment round_trip(const std::vector<OwnedFrame> &frames) {
    const std::string blob = qs::compress_segment(frames_of(frames));
    qs::DecodedSegment seg;
    std::string error;
    EXPECT_TRUE(qs::decode_segment(bytes(blob), blob.size(), seg, error)) << error;
    EXPECT_EQ(seg.frames.size(), frames.size());
    for (size_t i = 0; i < frames.size() && i < seg.frames.size(); ++i)
        expect_same(frames[i], seg.frames[i]);
    return seg;
}

std::string random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::string s(n, '\0');
    for (auto &c : s) c = static_cast<char>(rng());
    return s;
}

// Compresses without declaring the content size, as a streaming producer would.
std::string compress_streaming(std::string_view data) {
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
    std::string out(ZSTD_compressBound(data.size()) + 64, '\0');
    ZSTD_inBuffer in{data.data(), data.size(), 0};
    ZSTD_outBuffer ob{out.data(), out.size(), 0};
    size_t left = 0;
    do {
        left = ZSTD_compressStream2(cctx, &ob, &in, ZSTD_e_end);
    } while (left != 0 && !ZSTD_isError(left));
    ZSTD_freeCCtx(cctx);
    out.resize(ob.pos);
    return out;
}

std::string decode_error(const std::string &blob) {
    qs::DecodedSegment seg;
    std::string error;
    EXPECT_FALSE(qs::decode_segment(bytes(blob), blob.size(), seg, error));
    EXPECT_TRUE(seg.frames.empty());
    return error;
}

}  // namespace

TEST(Codec, RoundTripsEveryFlagCombination) {
    std::vector<OwnedFrame> frames;
    for (int bits = 0; bits < 8; ++bits)
        frames.push_back(make_frame(bits, bits & 1, bits & 2, bits & 4, "payload " + std::to_string(bits)));
    round_trip(frames);
}

TEST(Codec, RoundTripsEmptyPayloadAndEmptyTxn) {
    OwnedFrame f = make_frame(1, false, true, false, "");
    f.txn.clear();
    f.producer_sub = "";
    round_trip({f});
}

TEST(Codec, FrameLayoutIsLittleEndianAsSpecified) {
    OwnedFrame f = make_frame(2, true, true, true, "PAY");
    f.txn = "ab";
    f.producer_sub = "xyz";
    std::string raw;
    qs::append_frame(raw, f.view());
    const size_t body = 1 + 16 + 16 + 2 + 2 + 2 + 3 + 3;
    ASSERT_EQ(raw.size(), 4 + body);
    EXPECT_EQ(raw.size(), qs::frame_size(f.view()));
    EXPECT_EQ(static_cast<uint8_t>(raw[0]), body);
    EXPECT_EQ(raw.substr(1, 3), std::string(3, '\0'));
    EXPECT_EQ(static_cast<uint8_t>(raw[4]), 7);
    EXPECT_EQ(0, std::memcmp(raw.data() + 5, f.message_id, 16));
    EXPECT_EQ(0, std::memcmp(raw.data() + 21, f.trace_id, 16));
    EXPECT_EQ(raw.substr(37, 4), std::string("\x02\x00" "ab", 4));
    EXPECT_EQ(raw.substr(41, 5), std::string("\x03\x00" "xyz", 5));
    EXPECT_EQ(raw.substr(46), "PAY");
}

TEST(Codec, TxnOf65535BytesRoundTripsAnd65536Throws) {
    OwnedFrame f = make_frame(3, false, false, false, "p");
    f.txn.assign(65535, 't');
    round_trip({f});
    f.txn.assign(65536, 't');
    std::string raw = "keep";
    EXPECT_THROW(qs::append_frame(raw, f.view()), std::length_error);
    EXPECT_THROW(qs::frame_size(f.view()), std::length_error);
    EXPECT_EQ(raw, "keep");
}

TEST(Codec, ProducerSubOf65535BytesRoundTripsAnd65536Throws) {
    OwnedFrame f = make_frame(4, false, true, false, "p");
    f.producer_sub = std::string(65535, 's');
    round_trip({f});
    f.producer_sub = std::string(65536, 's');
    std::string raw;
    EXPECT_THROW(qs::append_frame(raw, f.view()), std::length_error);
    EXPECT_TRUE(raw.empty());
}

TEST(Codec, AppendFrameRefusesFlagsThatDisagreeWithFields) {
    OwnedFrame f = make_frame(5, false, false, false, "p");
    std::string raw;
    f.flags = 8;
    EXPECT_THROW(qs::append_frame(raw, f.view()), std::invalid_argument);
    f.flags = qs::kFrameTraceId;  // no trace id given
    EXPECT_THROW(qs::append_frame(raw, f.view()), std::invalid_argument);
    f.flags = qs::kFrameProducerSub;  // no producer sub given
    EXPECT_THROW(qs::append_frame(raw, f.view()), std::invalid_argument);
    f.flags = 0;
    f.has_trace = true;  // trace id given without its flag
    EXPECT_THROW(qs::append_frame(raw, f.view()), std::invalid_argument);
    EXPECT_TRUE(raw.empty());
}

TEST(Codec, LargePayloadRoundTrips) {
    std::string payload = random_bytes(3 << 20, 7) + std::string(5 << 20, 'z');
    auto seg = round_trip({make_frame(6, true, true, true, payload), make_frame(7, false, false, false, "tail")});
    EXPECT_EQ(seg.frames[0].payload.size(), payload.size());
}

// A ratio no header is trusted with (here thousands to one) takes the streaming path and
// still decodes, with the declared size checked against what came out.
TEST(Codec, HighlyCompressibleSegmentDecodes) {
    const std::string zeros(16 << 20, '\0');
    const std::string blob = qs::compress_segment(frames_of({make_frame(1, false, false, false, zeros)}));
    ASSERT_GT((16u << 20) / blob.size(), 1024u);
    qs::DecodedSegment seg;
    std::string error;
    ASSERT_TRUE(qs::decode_segment(bytes(blob), blob.size(), seg, error)) << error;
    ASSERT_EQ(seg.frames.size(), 1u);
    EXPECT_EQ(seg.frames[0].payload, zeros);
}

TEST(Codec, ManyFramesRoundTripInOrder) {
    std::vector<OwnedFrame> frames;
    for (int i = 0; i < 2000; ++i)
        frames.push_back(make_frame(i, i % 3 == 0, i % 5 == 0, i % 7 == 0, std::string(i % 50, 'a' + i % 26)));
    round_trip(frames);
}

TEST(Codec, DecodedSegmentViewsSurviveAMove) {
    std::vector<OwnedFrame> frames{make_frame(1, true, true, false, "moved payload")};
    const std::string blob = qs::compress_segment(frames_of(frames));
    qs::DecodedSegment a;
    std::string error;
    ASSERT_TRUE(qs::decode_segment(bytes(blob), blob.size(), a, error)) << error;
    qs::DecodedSegment b = std::move(a);
    expect_same(frames[0], b.frames[0]);
}

TEST(Codec, TxnHashIsXxh3_128BigEndian) {
    for (std::string txn : {std::string(), std::string("a"), std::string("order-42"), random_bytes(1000, 3)}) {
        uint8_t got[16];
        qs::txn_hash(txn, got);
        const XXH128_hash_t h = XXH3_128bits(txn.data(), txn.size());
        uint8_t want[16];
        for (int i = 0; i < 8; ++i) {
            want[i] = static_cast<uint8_t>(h.high64 >> (56 - 8 * i));
            want[8 + i] = static_cast<uint8_t>(h.low64 >> (56 - 8 * i));
        }
        EXPECT_EQ(0, std::memcmp(got, want, 16));
        XXH128_canonical_t canonical;
        XXH128_canonicalFromHash(&canonical, h);
        EXPECT_EQ(0, std::memcmp(got, canonical.digest, 16));
        std::string appended = "x";
        qs::append_txn_hash(appended, txn);
        EXPECT_EQ(appended.substr(1), std::string(reinterpret_cast<char *>(want), 16));
    }
}

TEST(Codec, DecodesBlobsWithoutDeclaredSizeAndSeveralZstdFrames) {
    std::vector<OwnedFrame> first{make_frame(1, false, false, false, "one"), make_frame(2, true, false, false, "two")};
    std::vector<OwnedFrame> second{make_frame(3, false, true, true, std::string(300000, 'q'))};
    const std::string blob = compress_streaming(frames_of(first)) + qs::compress_segment(frames_of(second));
    EXPECT_EQ(ZSTD_getFrameContentSize(blob.data(), blob.size()), ZSTD_CONTENTSIZE_UNKNOWN);
    qs::DecodedSegment seg;
    std::string error;
    ASSERT_TRUE(qs::decode_segment(bytes(blob), blob.size(), seg, error)) << error;
    ASSERT_EQ(seg.frames.size(), 3u);
    expect_same(first[0], seg.frames[0]);
    expect_same(first[1], seg.frames[1]);
    expect_same(second[0], seg.frames[2]);
}

TEST(Codec, RefusesAnEmptySegment) {
    EXPECT_EQ(decode_error(qs::compress_segment("")), "segment corrupt: empty segment (no frames)");
    EXPECT_EQ(decode_error(compress_streaming("")), "segment corrupt: empty segment (no frames)");
}

TEST(Codec, RefusesEmptyInputAndGarbage) {
    EXPECT_EQ(decode_error(""), "segment corrupt: bad zstd: empty input");
    for (uint32_t seed = 0; seed < 200; ++seed) {
        const std::string garbage = random_bytes(1 + seed % 64, seed);
        EXPECT_NE(decode_error(garbage).find("segment corrupt: bad zstd"), std::string::npos);
    }
}

// Every prefix of a valid decompressed buffer, re-compressed, either decodes as the frames
// it still holds whole (cut on a frame boundary) or is refused with where it broke.
TEST(Codec, RefusesTruncationAtEveryByteOffset) {
    std::vector<OwnedFrame> frames{make_frame(1, true, true, true, "payload-one"),
                                   make_frame(2, false, false, false, "p2"),
                                   make_frame(3, false, true, false, "")};
    const std::string raw = frames_of(frames);
    std::vector<size_t> boundaries{0};
    for (const auto &f : frames) boundaries.push_back(boundaries.back() + qs::frame_size(f.view()));
    for (size_t cut = 0; cut < raw.size(); ++cut) {
        const std::string blob = qs::compress_segment(std::string_view(raw).substr(0, cut));
        qs::DecodedSegment seg;
        std::string error;
        const bool ok = qs::decode_segment(bytes(blob), blob.size(), seg, error);
        const auto at = std::find(boundaries.begin(), boundaries.end(), cut);
        if (cut == 0) {
            EXPECT_EQ(error, "segment corrupt: empty segment (no frames)");
        } else if (at != boundaries.end()) {
            ASSERT_TRUE(ok) << "cut " << cut << ": " << error;
            EXPECT_EQ(seg.frames.size(), static_cast<size_t>(at - boundaries.begin()));
        } else {
            ASSERT_FALSE(ok) << "cut " << cut;
            EXPECT_EQ(error.rfind("segment corrupt: frame ", 0), 0u) << error;
            const bool says_where = error.find("runs past the end") != std::string::npos ||
                                    error.find("body length truncated") != std::string::npos;
            EXPECT_TRUE(says_where) << error;
        }
    }
    // The first cut inside the length prefix and inside the body, spelled out.
    const std::string prefix_cut = qs::compress_segment(std::string_view(raw).substr(0, boundaries[1] + 2));
    EXPECT_EQ(decode_error(prefix_cut),
              "segment corrupt: frame 1 at byte " + std::to_string(boundaries[1]) +
                  ": body length truncated: 2 of 4 bytes before the segment ends at byte " +
                  std::to_string(boundaries[1] + 2));
    const std::string body_cut = qs::compress_segment(std::string_view(raw).substr(0, 10));
    EXPECT_EQ(decode_error(body_cut).rfind("segment corrupt: frame 0 at byte 0: body length " +
                                               std::to_string(boundaries[1] - 4) + " runs past the end of the segment",
                                           0),
              0u);
}

TEST(Codec, RefusesTruncatedZstdAtEveryByteOffset) {
    const std::string blob = qs::compress_segment(frames_of({make_frame(1, true, true, false, random_bytes(500, 1))}));
    for (size_t cut = 0; cut < blob.size(); ++cut) {
        const std::string error = decode_error(blob.substr(0, cut));
        EXPECT_EQ(error.rfind("segment corrupt: bad zstd", 0), 0u) << "cut " << cut << ": " << error;
    }
    const std::string streamed = compress_streaming(frames_of({make_frame(2, false, false, false, random_bytes(500, 2))}));
    for (size_t cut = 0; cut < streamed.size(); ++cut) {
        const std::string error = decode_error(streamed.substr(0, cut));
        EXPECT_EQ(error.rfind("segment corrupt: bad zstd", 0), 0u) << "cut " << cut << ": " << error;
    }
}

// Fields rewritten inside a valid decompressed buffer: each is refused with its own words.
TEST(Codec, RefusesEachCorruptFieldWithItsMessage) {
    OwnedFrame f = make_frame(1, false, true, false, "payload");
    f.txn = "tx";
    f.producer_sub = "ps";
    const std::string good = frames_of({f});
    // Layout: [0,4) length, 4 flags, [5,21) message id, [21,23) txn length, [23,25) txn,
    // [25,27) producer-sub length, [27,29) producer sub, [29,36) payload.
    auto refused = [&](size_t at, std::string value) {
        std::string raw = good;
        raw.replace(at, value.size(), value);
        return decode_error(qs::compress_segment(raw));
    };
    EXPECT_EQ(refused(4, "\x0a"), "segment corrupt: frame 0 at byte 0: flags 0x0a at byte 4 have unknown bits");
    EXPECT_EQ(refused(4, "\x80"), "segment corrupt: frame 0 at byte 0: flags 0x80 at byte 4 have unknown bits");
    EXPECT_EQ(refused(0, std::string("\xff\x00\x00\x00", 4)),
              "segment corrupt: frame 0 at byte 0: body length 255 runs past the end of the segment "
              "(body would end at byte 259, segment ends at byte 36)");
    EXPECT_EQ(refused(0, std::string("\xff\xff\xff\xff", 4)).find("body length 4294967295 runs past the end"),
              std::string("segment corrupt: frame 0 at byte 0: ").size());
    EXPECT_EQ(refused(21, std::string("\x20\x00", 2)),
              "segment corrupt: frame 0 at byte 0: txn length 32 at byte 21 runs past the end of the body at byte 36");
    {  // 9 still fits: the producer sub swallows the payload, which may be empty.
        std::string raw = good;
        raw[25] = 9;
        const std::string blob = qs::compress_segment(raw);
        qs::DecodedSegment seg;
        std::string error;
        ASSERT_TRUE(qs::decode_segment(bytes(blob), blob.size(), seg, error)) << error;
        EXPECT_EQ(*seg.frames[0].producer_sub, "pspayload");
        EXPECT_TRUE(seg.frames[0].payload.empty());
    }
    EXPECT_EQ(refused(25, std::string("\x0a\x00", 2)),
              "segment corrupt: frame 0 at byte 0: producer-sub length 10 at byte 25 runs past the end of the body at byte 36");
    // A trace-id flag on a body too short to hold one.
    EXPECT_EQ(refused(4, "\x03"),
              "segment corrupt: frame 0 at byte 0: trace id at byte 21 needs 16 bytes but the body ends at byte 36");
    std::string short_body("\x05\x00\x00\x00\x00\x01\x02\x03\x04", 9);
    EXPECT_EQ(decode_error(qs::compress_segment(short_body)),
              "segment corrupt: frame 0 at byte 0: message id at byte 5 needs 16 bytes but the body ends at byte 9");
    std::string no_flags("\x00\x00\x00\x00", 4);
    EXPECT_EQ(decode_error(qs::compress_segment(no_flags)),
              "segment corrupt: frame 0 at byte 0: flags at byte 4 needs 1 byte but the body ends at byte 4");
}

TEST(Codec, FlippedBytesNeverReadOutOfBounds) {
    const std::string raw = frames_of({make_frame(1, true, true, true, "alpha"), make_frame(2, false, false, false, "beta")});
    const std::string blob = qs::compress_segment(raw);
    size_t refused = 0;
    for (size_t i = 0; i < blob.size(); ++i) {
        for (uint8_t mask : {0x01, 0x80, 0xff}) {
            std::string bad = blob;
            bad[i] = static_cast<char>(bad[i] ^ mask);
            qs::DecodedSegment seg;
            std::string error;
            if (!qs::decode_segment(bytes(bad), bad.size(), seg, error)) {
                ++refused;
                EXPECT_EQ(error.rfind("segment corrupt: ", 0), 0u);
                continue;
            }
            // zstd carries no checksum here, so a flip in a literal may decode; the views must
            // then still lie inside the segment's own buffer.
            const char *lo = reinterpret_cast<const char *>(seg.raw.data());
            const char *hi = lo + seg.raw.size();
            for (const auto &f : seg.frames) {
                EXPECT_TRUE(f.txn.data() >= lo && f.txn.data() + f.txn.size() <= hi);
                EXPECT_TRUE(f.payload.data() >= lo && f.payload.data() + f.payload.size() <= hi);
            }
        }
    }
    EXPECT_GT(refused, 0u);
    // Flips inside the decompressed frames, re-compressed.
    for (size_t i = 0; i < raw.size(); ++i) {
        std::string bad = raw;
        bad[i] = static_cast<char>(bad[i] ^ 0xff);
        const std::string b = qs::compress_segment(bad);
        qs::DecodedSegment seg;
        std::string error;
        if (!qs::decode_segment(bytes(b), b.size(), seg, error)) {
            EXPECT_EQ(error.rfind("segment corrupt: frame ", 0), 0u) << error;
        }
    }
}

// A zstd frame header declaring a terabyte: refused from the header, nothing allocated.
TEST(Codec, RefusesAFrameDeclaringAHugeSize) {
    std::string bomb("\x28\xb5\x2f\xfd", 4);  // magic, little-endian
    bomb.push_back('\xe0');                   // 8-byte content size, single segment
    const uint64_t declared = uint64_t{1} << 40;
    for (int i = 0; i < 8; ++i) bomb.push_back(static_cast<char>(declared >> (8 * i)));
    bomb.append("\x01\x00\x00", 3);  // last block, raw, empty
    EXPECT_EQ(decode_error(bomb), "segment corrupt: bad zstd: frame at byte 0 declares 1099511627776 decompressed "
                                  "bytes over the 268435456-byte ceiling");
    // Two frames whose declared sizes only pass the ceiling together.
    const std::string half = qs::compress_segment(std::string(3 << 20, 'h'));
    std::string out, error;
    EXPECT_FALSE(qs::zstd_decompress(bytes(half + half), 2 * half.size(), out, error, 5 << 20));
    EXPECT_EQ(error, "bad zstd: frame at byte " + std::to_string(half.size()) +
                         " declares 3145728 decompressed bytes, with the frames before it over the "
                         "5242880-byte ceiling");
    // A size under the ceiling that the input cannot hold is refused by the decoder without
    // first allocating what the header claims.
    std::string liar = bomb;
    const uint64_t claimed = uint64_t{200} << 20;
    for (int i = 0; i < 8; ++i) liar[5 + i] = static_cast<char>(claimed >> (8 * i));
    EXPECT_EQ(decode_error(liar), "segment corrupt: bad zstd: frames declare 209715200 bytes but hold 0");
}

TEST(Codec, StreamedOutputOverTheCeilingIsRefused) {
    const std::string big(4 << 20, '\0');
    const std::string blob = compress_streaming(big);
    ASSERT_LT(blob.size(), 4096u);
    std::string out, error;
    EXPECT_FALSE(qs::zstd_decompress(bytes(blob), blob.size(), out, error, 1 << 20));
    EXPECT_EQ(error, "bad zstd: decompresses to more than the 1048576-byte ceiling");
    EXPECT_TRUE(out.empty());
    EXPECT_TRUE(qs::zstd_decompress(bytes(blob), blob.size(), out, error, 4 << 20)) << error;
    EXPECT_EQ(out, big);
    const std::string declared = qs::compress_segment(big);
    EXPECT_FALSE(qs::zstd_decompress(bytes(declared), declared.size(), out, error, (4 << 20) - 1));
    EXPECT_NE(error.find("over the 4194303-byte ceiling"), std::string::npos);
}

TEST(Codec, UuidTextRoundTripsInPostgresForms) {
    uint8_t u[16];
    ASSERT_TRUE(qs::parse_uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", u));
    EXPECT_EQ(qs::format_uuid(u), "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
    for (const char *form : {"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "{a0eebc99-9c0b4ef8-bb6d6bb9bd380a11}",
                             "a0eebc999c0b4ef8bb6d6bb9bd380a11", "a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
                             "{a0eebc999c0b4ef8bb6d6bb9bd380a11}"}) {
        uint8_t v[16];
        ASSERT_TRUE(qs::parse_uuid(form, v)) << form;
        EXPECT_EQ(0, std::memcmp(u, v, 16)) << form;
    }
    for (const char *bad : {"", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a111",
                            "-a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-",
                            "a0eeb-c99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99--9c0b-4ef8-bb6d-6bb9bd380a11",
                            "g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                            "a0eebc99 9c0b-4ef8-bb6d-6bb9bd380a11"}) {
        uint8_t v[16] = {};
        EXPECT_FALSE(qs::parse_uuid(bad, v)) << bad;
    }
    uint8_t zero[16] = {};
    EXPECT_EQ(qs::format_uuid(zero), "00000000-0000-0000-0000-000000000000");
}

// ---------------------------------------------------------------- the C API

TEST(CodecCApi, DecodesFramesThroughTheCApi) {
    std::vector<OwnedFrame> frames{make_frame(1, true, true, true, "first"), make_frame(2, false, false, false, "")};
    const std::string blob = qs::compress_segment(frames_of(frames));
    queen_sweeper_segment *seg = nullptr;
    ASSERT_EQ(queen_sweeper_segment_decode(bytes(blob), blob.size(), &seg), QUEEN_SWEEPER_OK);
    ASSERT_NE(seg, nullptr);
    ASSERT_EQ(queen_sweeper_segment_count(seg), 2u);
    queen_sweeper_frame f{};
    f.struct_size = sizeof f;
    ASSERT_EQ(queen_sweeper_segment_frame(seg, 0, &f), QUEEN_SWEEPER_OK);
    EXPECT_EQ(f.struct_size, sizeof f);
    EXPECT_EQ(f.flags, 7);
    EXPECT_EQ(0, std::memcmp(f.message_id, frames[0].message_id, 16));
    EXPECT_EQ(0, std::memcmp(f.trace_id, frames[0].trace_id, 16));
    EXPECT_EQ(std::string(f.txn, f.txn_len), frames[0].txn);
    ASSERT_NE(f.producer_sub, nullptr);
    EXPECT_EQ(std::string(f.producer_sub, f.producer_sub_len), *frames[0].producer_sub);
    EXPECT_EQ(std::string(reinterpret_cast<const char *>(f.payload), f.payload_len), "first");
    std::memset(f.trace_id, 0x55, 16);
    ASSERT_EQ(queen_sweeper_segment_frame(seg, 1, &f), QUEEN_SWEEPER_OK);
    EXPECT_EQ(f.flags, 0);
    EXPECT_EQ(f.producer_sub, nullptr);
    EXPECT_EQ(f.producer_sub_len, 0u);
    EXPECT_EQ(f.payload_len, 0u);
    const uint8_t zero[16] = {};
    EXPECT_EQ(0, std::memcmp(f.trace_id, zero, 16));
    queen_sweeper_segment_free(&seg);
    EXPECT_EQ(seg, nullptr);
}

TEST(CodecCApi, CorruptBlobIsECorruptWithTheDecodersMessage) {
    const std::string garbage = "definitely not zstd";
    queen_sweeper_segment *seg = reinterpret_cast<queen_sweeper_segment *>(0x1);
    EXPECT_EQ(queen_sweeper_segment_decode(bytes(garbage), garbage.size(), &seg), QUEEN_SWEEPER_ECORRUPT);
    EXPECT_EQ(seg, nullptr);
    EXPECT_EQ(std::string(queen_sweeper_last_error()).rfind("segment corrupt: bad zstd", 0), 0u);
    std::string raw = frames_of({make_frame(1, false, false, false, "x")});
    raw[4] = 0x10;
    const std::string blob = qs::compress_segment(raw);
    EXPECT_EQ(queen_sweeper_segment_decode(bytes(blob), blob.size(), &seg), QUEEN_SWEEPER_ECORRUPT);
    EXPECT_STREQ(queen_sweeper_last_error(), "segment corrupt: frame 0 at byte 0: flags 0x10 at byte 4 have unknown bits");
    const std::string empty = qs::compress_segment("");
    EXPECT_EQ(queen_sweeper_segment_decode(bytes(empty), empty.size(), &seg), QUEEN_SWEEPER_ECORRUPT);
    EXPECT_STREQ(queen_sweeper_last_error(), "segment corrupt: empty segment (no frames)");
}

TEST(CodecCApi, NullArgumentsAreEInvalNamingTheArgument) {
    const std::string blob = qs::compress_segment(frames_of({make_frame(1, false, false, false, "x")}));
    queen_sweeper_segment *seg = reinterpret_cast<queen_sweeper_segment *>(0x1);
    EXPECT_EQ(queen_sweeper_segment_decode(nullptr, 3, &seg), QUEEN_SWEEPER_EINVAL);
    EXPECT_EQ(seg, nullptr);
    EXPECT_STREQ(queen_sweeper_last_error(), "queen_sweeper_segment_decode: blob is NULL");
    EXPECT_EQ(queen_sweeper_segment_decode(bytes(blob), blob.size(), nullptr), QUEEN_SWEEPER_EINVAL);
    EXPECT_STREQ(queen_sweeper_last_error(), "queen_sweeper_segment_decode: out is NULL");
    EXPECT_EQ(queen_sweeper_segment_count(nullptr), 0u);
    queen_sweeper_frame f{};
    f.struct_size = sizeof f;
    EXPECT_EQ(queen_sweeper_segment_frame(nullptr, 0, &f), QUEEN_SWEEPER_EINVAL);
    EXPECT_STREQ(queen_sweeper_last_error(), "queen_sweeper_segment_frame: seg is NULL");
    ASSERT_EQ(queen_sweeper_segment_decode(bytes(blob), blob.size(), &seg), QUEEN_SWEEPER_OK);
    EXPECT_EQ(queen_sweeper_segment_frame(seg, 0, nullptr), QUEEN_SWEEPER_EINVAL);
    EXPECT_STREQ(queen_sweeper_last_error(), "queen_sweeper_segment_frame: out is NULL");
    queen_sweeper_segment_free(&seg);
    queen_sweeper_segment_free(&seg);
    queen_sweeper_segment_free(nullptr);
    uint8_t h[16];
    EXPECT_EQ(queen_sweeper_txn_hash("x", 1, nullptr), QUEEN_SWEEPER_EINVAL);
    EXPECT_STREQ(queen_sweeper_last_error(), "queen_sweeper_txn_hash: out16 is NULL");
    EXPECT_EQ(queen_sweeper_txn_hash(nullptr, 1, h), QUEEN_SWEEPER_EINVAL);
    EXPECT_STREQ(queen_sweeper_last_error(), "queen_sweeper_txn_hash: txn is NULL with len 1");
    EXPECT_EQ(queen_sweeper_txn_hash(nullptr, 0, h), QUEEN_SWEEPER_OK);
    uint8_t want[16];
    qs::txn_hash("", want);
    EXPECT_EQ(0, std::memcmp(h, want, 16));
}

TEST(CodecCApi, IndexOutOfRangeAndShortStructAreEInval) {
    const std::string blob = qs::compress_segment(frames_of({make_frame(1, false, false, false, "x")}));
    queen_sweeper_segment *seg = nullptr;
    ASSERT_EQ(queen_sweeper_segment_decode(bytes(blob), blob.size(), &seg), QUEEN_SWEEPER_OK);
    queen_sweeper_frame f{};
    f.struct_size = sizeof f;
    EXPECT_EQ(queen_sweeper_segment_frame(seg, 1, &f), QUEEN_SWEEPER_EINVAL);
    EXPECT_STREQ(queen_sweeper_last_error(),
                 "queen_sweeper_segment_frame: index 1 is out of range (the segment has 1 frames)");
    EXPECT_EQ(queen_sweeper_segment_frame(seg, SIZE_MAX, &f), QUEEN_SWEEPER_EINVAL);
    f.struct_size = offsetof(queen_sweeper_frame, payload_len);  // one field short of 1.0
    EXPECT_EQ(queen_sweeper_segment_frame(seg, 0, &f), QUEEN_SWEEPER_EINVAL);
    EXPECT_NE(std::string(queen_sweeper_last_error()).find("out->struct_size is"), std::string::npos);
    EXPECT_EQ(f.payload, nullptr);  // nothing written on refusal
    f.struct_size = 0;
    EXPECT_EQ(queen_sweeper_segment_frame(seg, 0, &f), QUEEN_SWEEPER_EINVAL);
    // A caller that knows a longer struct (a later minor) is served the 1.0 fields.
    struct Longer {
        queen_sweeper_frame v1;
        uint64_t future;
    } longer{};
    longer.v1.struct_size = sizeof longer;
    longer.future = 0xfeedface;
    EXPECT_EQ(queen_sweeper_segment_frame(seg, 0, &longer.v1), QUEEN_SWEEPER_OK);
    EXPECT_EQ(longer.v1.struct_size, sizeof longer);
    EXPECT_EQ(longer.future, 0xfeedfaceu);
    EXPECT_EQ(longer.v1.payload_len, 1u);
    queen_sweeper_segment_free(&seg);
}

TEST(CodecCApi, TxnHashMatchesTheCodec) {
    const std::string txn = "order-7";
    uint8_t a[16], b[16];
    ASSERT_EQ(queen_sweeper_txn_hash(txn.data(), txn.size(), a), QUEEN_SWEEPER_OK);
    qs::txn_hash(txn, b);
    EXPECT_EQ(0, std::memcmp(a, b, 16));
}

// The level a segment is compressed at, at both ends of the small band: a frame or two of
// a typical payload goes at zstd's fastest level, anything from 512 bytes at level 3; both
// read back the same.
TEST(Codec, SmallSegmentsGoAtTheFastestLevelAndTheRestAtLevelThree) {
    EXPECT_EQ(qs::segment_zstd_level(0), -1);
    EXPECT_EQ(qs::segment_zstd_level(qs::kSegmentSmallBytes - 1), -1);
    EXPECT_EQ(qs::segment_zstd_level(qs::kSegmentSmallBytes), 3);
    EXPECT_EQ(qs::segment_zstd_level(size_t{1} << 30), 3);
    for (const size_t size : {qs::kSegmentSmallBytes - 1, qs::kSegmentSmallBytes}) {
        const std::string raw(size, 'q');
        const std::string blob = qs::compress_segment(raw);
        EXPECT_EQ(ZSTD_getFrameContentSize(blob.data(), blob.size()), size);
        std::string out, error;
        ASSERT_TRUE(qs::zstd_decompress(reinterpret_cast<const uint8_t *>(blob.data()), blob.size(), out, error,
                                        qs::kMaxDecompressedBytes))
            << error;
        EXPECT_EQ(out, raw);
    }
    // What compress_segment writes for one typical frame (a 200-byte JSON payload) is what
    // zstd writes at the small level, not at level 3 (the input tells the two apart).
    std::string frame = "{\"order\":48213,\"customer\":\"c-417\",\"items\":[1,2,3],\"note\":\"";
    for (int i = 0; frame.size() < 220; ++i) frame.push_back(static_cast<char>('a' + (i * 7919) % 26));
    frame += "\"}";
    auto at_level = [&](int level) {
        std::string z(ZSTD_compressBound(frame.size()), '\0');
        const size_t n = ZSTD_compress(z.data(), z.size(), frame.data(), frame.size(), level);
        EXPECT_FALSE(ZSTD_isError(n));
        z.resize(n);
        return z;
    };
    ASSERT_NE(at_level(qs::kSegmentSmallZstdLevel), at_level(qs::kSegmentZstdLevel));
    EXPECT_EQ(qs::compress_segment(frame), at_level(qs::kSegmentSmallZstdLevel));
}

// The segment compressor keeps one context per thread: what it writes must not depend on
// what it compressed before (a long, incompressible segment, then a tiny one, an empty one,
// a repetitive one), and must be what a fresh ZSTD_compress at the same level writes.
TEST(Codec, KeptCompressionContextWritesWhatAFreshOneWrites) {
    std::mt19937 rng(7);
    std::string noise(3 << 20, '\0');
    for (char &c : noise) c = static_cast<char>(rng());
    const std::vector<std::string> inputs = {noise, "x", "", std::string(1 << 20, 'a'), noise.substr(5, 70000),
                                             "x", std::string(17, 'b')};
    for (int round = 0; round < 2; ++round)
        for (const std::string &in : inputs) {
            std::string fresh(ZSTD_compressBound(in.size()), '\0');
            const size_t n = ZSTD_compress(fresh.data(), fresh.size(), in.data(), in.size(),
                                           qs::segment_zstd_level(in.size()));
            ASSERT_FALSE(ZSTD_isError(n));
            fresh.resize(n);
            EXPECT_EQ(qs::compress_segment(in), fresh) << "input of " << in.size() << " bytes, round " << round;
        }
}
