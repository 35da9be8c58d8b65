// The fire packer: grouping, ordering, duplicate txns, byte caps, and that no claimed row is
// ever lost or packed twice.
#include <gtest/gtest.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "codec/codec.hpp"
#include "codec/packer.hpp"

namespace qs = qsw;

namespace {

const std::string kTenantA = "00000000-0000-0000-0000-000000000001";
const std::string kTenantB = "00000000-0000-0000-0000-000000000002";

qs::ClaimedTimer timer(const std::string &tenant, const std::string &queue, const std::string &partition,
                       const std::string &txn, std::string payload = "p") {
    static uint32_t next = 0;
    qs::ClaimedTimer t;
    t.tenant = tenant;
    t.queue = queue;
    t.partition = partition;
    t.timer_key = "key-" + std::to_string(next);
    t.txn = txn;
    const uint32_t id = next++;
    std::memcpy(t.message_id, &id, sizeof id);
    t.message_id[15] = 0x42;
    t.payload = std::move(payload);
    t.claim_token = "11111111-1111-1111-1111-111111111111";
    return t;
}

std::string random_bytes(size_t n, std::mt19937 &rng) {
    std::string s(n, '\0');
    for (auto &c : s) c = static_cast<char>(rng());
    return s;
}

std::string zstd(const std::string &plain) {
    std::string out(ZSTD_compressBound(plain.size()), '\0');
    out.resize(ZSTD_compress(out.data(), out.size(), plain.data(), plain.size(), 1));
    return out;
}

std::vector<const qs::PackedSegment *> segments_of(const qs::PackResult &r) {
    std::vector<const qs::PackedSegment *> out;
    for (const auto &b : r.batches)
        for (const auto &s : b.segments) out.push_back(&s);
    return out;
}

std::vector<std::vector<size_t>> rows_of(const qs::PackResult &r) {
    std::vector<std::vector<size_t>> out;
    for (const auto *s : segments_of(r)) out.push_back(s->rows);
    return out;
}

// Decodes every segment and checks it against the rows it claims to carry: frame fields,
// hashes, counts, sizes, and that each segment is one (tenant, queue, partition).
void expect_segments_match_rows(const qs::PackResult &r, const std::vector<qs::ClaimedTimer> &rows) {
    for (const auto &b : r.batches) {
        size_t sum = 0;
        for (const auto &s : b.segments) sum += s.bytes;
        EXPECT_EQ(b.bytes, sum);
        EXPECT_FALSE(b.segments.empty());
    }
    for (const auto *s : segments_of(r)) {
        ASSERT_FALSE(s->rows.empty());
        EXPECT_EQ(s->count, s->rows.size());
        EXPECT_EQ(s->hashes.size(), 16 * s->rows.size());
        EXPECT_EQ(s->bytes, s->blob.size() + s->hashes.size());
        qs::DecodedSegment seg;
        std::string error;
        ASSERT_TRUE(qs::decode_segment(reinterpret_cast<const uint8_t *>(s->blob.data()), s->blob.size(), seg, error))
            << error;
        ASSERT_EQ(seg.frames.size(), s->rows.size());
        std::set<std::string> hashes;
        for (size_t i = 0; i < s->rows.size(); ++i) hashes.insert(s->hashes.substr(16 * i, 16));
        EXPECT_EQ(hashes.size(), s->rows.size()) << "a segment repeats a transaction hash";
        for (size_t i = 0; i < s->rows.size(); ++i) {
            const qs::ClaimedTimer &t = rows[s->rows[i]];
            const qs::FrameView &f = seg.frames[i];
            EXPECT_EQ(t.tenant, s->tenant);
            EXPECT_EQ(t.queue, s->queue);
            EXPECT_EQ(t.partition, s->partition);
            EXPECT_EQ(f.flags, (t.producer_sub ? 2 : 0) | (t.encrypted ? 4 : 0));
            EXPECT_EQ(f.trace_id, nullptr);
            EXPECT_EQ(0, std::memcmp(f.message_id, t.message_id, 16));
            EXPECT_EQ(f.txn, t.txn);
            EXPECT_EQ(f.producer_sub.has_value(), t.producer_sub.has_value());
            if (t.producer_sub && f.producer_sub) {
                EXPECT_EQ(*f.producer_sub, *t.producer_sub);
            }
            if (!t.payload_zstd) {
                EXPECT_EQ(f.payload, t.payload);
            }
            uint8_t h[16];
            qs::txn_hash(t.txn, h);
            EXPECT_EQ(s->hashes.substr(16 * i, 16), std::string(reinterpret_cast<char *>(h), 16));
        }
    }
}

// Every input row in exactly one segment or in rejected, never both, never twice.
void expect_every_row_once(const qs::PackResult &r, size_t n) {
    std::vector<int> seen(n, 0);
    for (const auto *s : segments_of(r))
        for (size_t i : s->rows) {
            ASSERT_LT(i, n);
            ++seen[i];
        }
    for (const auto &[i, reason] : r.rejected) {
        ASSERT_LT(i, n);
        EXPECT_FALSE(reason.empty());
        ++seen[i];
    }
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "row " << i;
}

}  // namespace

TEST(Packer, EmptyInputGivesNoBatches) {
    const auto r = qs::pack_timers({}, 1 << 20);
    EXPECT_TRUE(r.batches.empty());
    EXPECT_TRUE(r.rejected.empty());
}

TEST(Packer, GroupsInOrderOfFirstAppearanceKeepingClaimOrder) {
    std::vector<qs::ClaimedTimer> rows{
        timer(kTenantA, "q2", "Default", "t0"), timer(kTenantA, "q1", "Default", "t1"),
        timer(kTenantA, "q2", "Default", "t2"), timer(kTenantA, "q1", "p9", "t3"),
        timer(kTenantA, "q1", "Default", "t4"), timer(kTenantA, "q2", "Default", "t5"),
    };
    const auto r = qs::pack_timers(rows, 8 << 20);
    ASSERT_EQ(r.batches.size(), 1u);
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0, 2, 5}, {1, 4}, {3}}));
    const auto segs = segments_of(r);
    EXPECT_EQ(segs[0]->queue, "q2");
    EXPECT_EQ(segs[1]->queue, "q1");
    EXPECT_EQ(segs[1]->partition, "Default");
    EXPECT_EQ(segs[2]->partition, "p9");
    expect_segments_match_rows(r, rows);
}

TEST(Packer, TenantsWithTheSameQueueNameStaySeparate) {
    std::vector<qs::ClaimedTimer> rows{
        timer(kTenantA, "orders", "Default", "x"), timer(kTenantB, "orders", "Default", "x"),
        timer(kTenantA, "orders", "Default", "y"), timer(kTenantB, "orders", "Default", "y"),
    };
    const auto r = qs::pack_timers(rows, 8 << 20);
    // The same txn under two tenants is two identities: no duplicate split.
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0, 2}, {1, 3}}));
    EXPECT_EQ(segments_of(r)[0]->tenant, kTenantA);
    EXPECT_EQ(segments_of(r)[1]->tenant, kTenantB);
    expect_segments_match_rows(r, rows);
}

TEST(Packer, DuplicateTxnGoesToALaterSegmentOfItsOwn) {
    std::vector<qs::ClaimedTimer> rows{
        timer(kTenantA, "q", "Default", "a"),  // 0
        timer(kTenantA, "q", "Default", "b"),  // 1
        timer(kTenantA, "q", "Default", "a"),  // 2: repeat of 0
        timer(kTenantA, "q", "Default", "c"),  // 3
        timer(kTenantA, "q", "Default", "a"),  // 4: second repeat of 0
        timer(kTenantA, "r", "Default", "a"),  // 5: another queue, not a repeat
        timer(kTenantA, "q", "Default", "b"),  // 6: repeat of 1
    };
    const auto r = qs::pack_timers(rows, 8 << 20);
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0, 1, 3}, {5}, {2}, {6}, {4}}));
    expect_segments_match_rows(r, rows);
    expect_every_row_once(r, rows.size());
}

// The dedup window is the queue's, so a repeat in another partition must still come after the
// segment holding its first occurrence, even when its partition's group was seen first.
TEST(Packer, DuplicateTxnAcrossPartitionsComesAfterTheFirst) {
    std::vector<qs::ClaimedTimer> rows{
        timer(kTenantA, "q", "p2", "y"),  // 0
        timer(kTenantA, "q", "p1", "x"),  // 1
        timer(kTenantA, "q", "p2", "x"),  // 2: repeat of 1, in the group seen first
    };
    const auto r = qs::pack_timers(rows, 8 << 20);
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0}, {1}, {2}}));
    expect_segments_match_rows(r, rows);
}

// The fire refuses a segment whose hashes repeat, and the empty txn hashes like any other.
TEST(Packer, EmptyTxnRepeatsAreSplitLikeAnyOther) {
    std::vector<qs::ClaimedTimer> rows{timer(kTenantA, "q", "Default", ""), timer(kTenantA, "q", "Default", "x"),
                                       timer(kTenantA, "q", "Default", "")};
    const auto r = qs::pack_timers(rows, 8 << 20);
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0, 1}, {2}}));
}

TEST(Packer, ByteCapSplitsIntoSeveralBatches) {
    std::mt19937 rng(11);
    std::vector<qs::ClaimedTimer> rows;
    for (int i = 0; i < 40; ++i) rows.push_back(timer(kTenantA, "q", "Default", "t" + std::to_string(i), random_bytes(1000, rng)));
    const size_t cap = 8 * 1024;
    const auto r = qs::pack_timers(rows, cap);
    ASSERT_GT(r.batches.size(), 4u);
    std::vector<size_t> order;
    for (const auto *s : segments_of(r)) {
        EXPECT_LE(s->bytes, cap);
        order.insert(order.end(), s->rows.begin(), s->rows.end());
    }
    for (const auto &b : r.batches) EXPECT_LE(b.bytes, cap);
    // Split, but still in claim order across the pieces.
    std::vector<size_t> want(rows.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = i;
    EXPECT_EQ(order, want);
    // Batches are full: the next segment would not have fitted in the one before.
    for (size_t i = 1; i < r.batches.size(); ++i)
        EXPECT_GT(r.batches[i - 1].bytes + r.batches[i].segments.front().bytes, cap);
    expect_segments_match_rows(r, rows);
}

TEST(Packer, SmallSegmentsShareABatch) {
    std::vector<qs::ClaimedTimer> rows;
    for (int q = 0; q < 10; ++q) rows.push_back(timer(kTenantA, "q" + std::to_string(q), "Default", "t"));
    const auto r = qs::pack_timers(rows, 1 << 20);
    ASSERT_EQ(r.batches.size(), 1u);
    EXPECT_EQ(r.batches[0].segments.size(), 10u);
}

TEST(Packer, OversizedTimerIsABatchOfItsOwn) {
    std::mt19937 rng(5);
    std::vector<qs::ClaimedTimer> rows{
        timer(kTenantA, "q", "Default", "small-0"),
        timer(kTenantA, "q", "Default", "big", random_bytes(64 * 1024, rng)),
        timer(kTenantA, "q", "Default", "small-1"),
    };
    const size_t cap = 4096;
    const auto r = qs::pack_timers(rows, cap);
    EXPECT_TRUE(r.rejected.empty());
    ASSERT_EQ(r.batches.size(), 3u);
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0}, {1}, {2}}));
    ASSERT_EQ(r.batches[1].segments.size(), 1u);
    EXPECT_GT(r.batches[1].bytes, cap);
    expect_segments_match_rows(r, rows);
}

TEST(Packer, ZeroCapStillPacksEveryRowAlone) {
    std::vector<qs::ClaimedTimer> rows{timer(kTenantA, "q", "Default", "a"), timer(kTenantA, "q", "Default", "b")};
    const auto r = qs::pack_timers(rows, 0);
    EXPECT_EQ(r.batches.size(), 2u);
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0}, {1}}));
}

TEST(Packer, ZstdPayloadIsDecompressedBeforeFraming) {
    const std::string plain = "a payload that was stored compressed " + std::string(500, 'z');
    auto row = timer(kTenantA, "q", "Default", "t", zstd(plain));
    row.payload_zstd = true;
    std::vector<qs::ClaimedTimer> rows{row};
    const auto r = qs::pack_timers(rows, 1 << 20);
    ASSERT_EQ(segments_of(r).size(), 1u);
    const auto *s = segments_of(r)[0];
    qs::DecodedSegment seg;
    std::string error;
    ASSERT_TRUE(qs::decode_segment(reinterpret_cast<const uint8_t *>(s->blob.data()), s->blob.size(), seg, error));
    EXPECT_EQ(seg.frames[0].payload, plain);
    EXPECT_EQ(seg.frames[0].flags, 0);
}

TEST(Packer, CorruptZstdPayloadIsRejectedWhileTheRestPacks) {
    auto bad = timer(kTenantA, "q", "Default", "bad", "this is not zstd");
    bad.payload_zstd = true;
    auto empty = timer(kTenantA, "q", "Default", "empty", "");
    empty.payload_zstd = true;
    std::vector<qs::ClaimedTimer> rows{timer(kTenantA, "q", "Default", "ok-0"), bad,
                                       timer(kTenantA, "q", "Default", "ok-1"), empty};
    const auto r = qs::pack_timers(rows, 1 << 20);
    ASSERT_EQ(r.rejected.size(), 2u);
    EXPECT_EQ(r.rejected[0].first, 1u);
    EXPECT_EQ(r.rejected[0].second.rfind("payload_zstd payload does not inflate within the 1048576-byte payload limit: bad zstd", 0), 0u)
        << r.rejected[0].second;
    EXPECT_EQ(r.rejected[1].first, 3u);
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0, 2}}));
    expect_segments_match_rows(r, rows);
}

TEST(Packer, OverlongTxnOrProducerSubIsRejected) {
    auto long_sub = timer(kTenantA, "q", "Default", "s");
    long_sub.producer_sub = std::string(65536, 's');
    std::vector<qs::ClaimedTimer> rows{timer(kTenantA, "q", "Default", std::string(65536, 't')),
                                       timer(kTenantA, "q", "Default", std::string(65535, 't')), long_sub};
    const auto r = qs::pack_timers(rows, 1 << 20);
    ASSERT_EQ(r.rejected.size(), 2u);
    EXPECT_EQ(r.rejected[0].first, 0u);
    EXPECT_EQ(r.rejected[0].second, "txn is 65536 bytes, over the 65535-byte frame limit");
    EXPECT_EQ(r.rejected[1].first, 2u);
    EXPECT_EQ(r.rejected[1].second, "producer sub is 65536 bytes, over the 65535-byte frame limit");
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{1}}));
}

TEST(Packer, FramesCarryProducerSubAndEncryptedFlags) {
    auto sub = timer(kTenantA, "q", "Default", "a");
    sub.producer_sub = "user-7";
    auto enc = timer(kTenantA, "q", "Default", "b", std::string("\x00\x01\x02", 3));
    enc.encrypted = true;
    auto both = timer(kTenantA, "q", "Default", "c");
    both.producer_sub = "";
    both.encrypted = true;
    std::vector<qs::ClaimedTimer> rows{sub, enc, both, timer(kTenantA, "q", "Default", "d")};
    const auto r = qs::pack_timers(rows, 1 << 20);
    expect_segments_match_rows(r, rows);
    EXPECT_EQ(rows_of(r), (std::vector<std::vector<size_t>>{{0, 1, 2, 3}}));
}

// Random inputs under a fixed seed: every row exactly once, every segment decodes to its
// rows, claim order within a group, repeats after their first occurrence, and only a lone
// timer ever passes the cap.
TEST(Packer, EveryRowIsAccountedForExactlyOnce) {
    std::mt19937 rng(20240611);
    for (int round = 0; round < 200; ++round) {
        const size_t n = rng() % 120;
        std::vector<qs::ClaimedTimer> rows;
        for (size_t i = 0; i < n; ++i) {
            const std::string tenant = rng() % 3 == 0 ? kTenantB : kTenantA;
            auto t = timer(tenant, "q" + std::to_string(rng() % 3), "p" + std::to_string(rng() % 2),
                           rng() % 4 == 0 ? "" : "txn-" + std::to_string(rng() % 30),
                           random_bytes(rng() % 4 == 0 ? rng() % 6000 : rng() % 100, rng));
            if (rng() % 5 == 0) t.producer_sub = "sub-" + std::to_string(rng() % 4);
            t.encrypted = rng() % 6 == 0;
            switch (rng() % 10) {
                case 0:
                    t.payload_zstd = true;
                    t.payload = zstd(t.payload);
                    break;
                case 1:
                    t.payload_zstd = true;  // not zstd at all: rejected
                    t.payload = "junk" + t.payload;
                    break;
                default:
                    break;
            }
            rows.push_back(std::move(t));
        }
        const size_t cap = std::vector<size_t>{0, 512, 4096, 20000, 1 << 20}[rng() % 5];
        const auto r = qs::pack_timers(rows, cap);
        expect_every_row_once(r, rows.size());
        expect_segments_match_rows(r, rows);
        for (const auto &b : r.batches) {
            if (b.bytes > cap) {
                EXPECT_EQ(b.segments.size(), 1u);
                EXPECT_EQ(b.segments[0].count, 1u);
            }
        }
        // Order: rows of one (tenant, queue, partition) keep claim order across its segments
        // unless one is a repeat, and a repeat's segment follows the first occurrence's.
        std::map<std::tuple<std::string, std::string, std::string>, size_t> first_segment_of_txn;
        const auto segs = segments_of(r);
        std::map<size_t, size_t> segment_of_row;
        for (size_t si = 0; si < segs.size(); ++si)
            for (size_t row : segs[si]->rows) segment_of_row[row] = si;
        std::map<std::tuple<std::string, std::string, std::string>, std::pair<size_t, size_t>> last_in_group;
        for (size_t i = 0; i < rows.size(); ++i) {
            auto it = segment_of_row.find(i);
            if (it == segment_of_row.end()) continue;
            const auto &t = rows[i];
            auto key = std::make_tuple(t.tenant, t.queue, t.txn);
            auto [first, inserted] = first_segment_of_txn.try_emplace(key, it->second);
            if (!inserted) {
                EXPECT_GT(it->second, first->second) << "repeat of row's txn not after its first";
                EXPECT_EQ(segs[it->second]->count, 1u);
                continue;
            }
            auto group = std::make_tuple(t.tenant, t.queue, t.partition);
            auto [last, fresh] = last_in_group.try_emplace(group, std::make_pair(it->second, i));
            if (!fresh) {
                EXPECT_GE(it->second, last->second.first);
                last->second = {it->second, i};
            }
        }
    }
}
