#include "codec/packer.hpp"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "codec/codec.hpp"

namespace qsw {
namespace {

// A row that frames: its payload as it goes into the frame and what it will cost.
struct Framed {
    size_t row = 0;
    std::string_view payload;
    size_t frame_bytes = 0;  // the frame plus its 16-byte hash
};

// Three names of a row (a tuple of views into it) and their hash, for the packer's maps.
using Names = std::tuple<std::string_view, std::string_view, std::string_view>;
struct NamesHash {
    size_t operator()(const Names &n) const {
        const std::hash<std::string_view> h;
        size_t x = h(std::get<0>(n));
        x = x * 1000003u ^ h(std::get<1>(n));
        return x * 1000003u ^ h(std::get<2>(n));
    }
};

FrameView view_of(const ClaimedTimer &t, std::string_view payload) {
    FrameView v;
    v.flags = static_cast<uint8_t>((t.producer_sub ? kFrameProducerSub : 0) |
                                   (t.encrypted ? kFrameEncrypted : 0));
    v.message_id = t.message_id;
    v.txn = t.txn;
    if (t.producer_sub) v.producer_sub = std::string_view(*t.producer_sub);
    v.payload = payload;
    return v;
}

class Packer {
public:
    Packer(const std::vector<ClaimedTimer> &rows, size_t max_fire_bytes, size_t inflate_budget)
        : rows_(rows), max_(max_fire_bytes), inflate_left_(inflate_budget), inflated_(rows.size()) {}

    PackResult run() {
        std::vector<Framed> framed = frame_rows();
        place(framed);
        batch();
        return std::move(result_);
    }

private:
    // Every row is framed (or rejected) up front, in input order, so one bad row costs only
    // itself and the rejections come back in the order the caller claimed them.
    std::vector<Framed> frame_rows() {
        std::vector<Framed> out;
        out.reserve(rows_.size());
        for (size_t i = 0; i < rows_.size(); ++i) {
            const ClaimedTimer &t = rows_[i];
            std::string_view payload = t.payload;
            // The segment is compressed as a whole and a frame has no zstd flag, so a payload
            // stored compressed goes into the frame as its plain bytes.
            if (t.payload_zstd) {
                // Never more than the payload limit per row and the budget per call: a row
                // that would pass the budget waits for a later claim (deferred), one that
                // inflates past the limit is refused on its own. What the table holds can
                // then never decide how much memory a sweeper takes.
                if (inflate_left_ < kMaxPayloadBytes && inflated_any_) {
                    result_.deferred.push_back(i);
                    continue;
                }
                std::string error;
                if (!zstd_decompress(reinterpret_cast<const uint8_t *>(t.payload.data()),
                                     t.payload.size(), inflated_[i], error, kMaxPayloadBytes)) {
                    inflated_[i].clear();
                    inflated_[i].shrink_to_fit();
                    result_.rejected.emplace_back(i, "payload_zstd payload does not inflate within the " +
                                                         std::to_string(kMaxPayloadBytes) +
                                                         "-byte payload limit: " + error);
                    continue;
                }
                inflated_any_ = true;
                inflate_left_ -= std::min(inflate_left_, inflated_[i].size());
                payload = inflated_[i];
            }
            try {
                out.push_back({i, payload, frame_size(view_of(t, payload)) + kTxnHashBytes});
            } catch (const std::length_error &e) {
                result_.rejected.emplace_back(i, e.what());
            }
        }
        return out;
    }

    // Decides which rows share a segment and in what order the segments go.
    void place(const std::vector<Framed> &framed) {
        // Occurrence of each row's txn within its (tenant, queue): 0 for the first. Hashed,
        // not ordered: rows of one claim share their tenant and queue, so an ordered map
        // compared those names in full at every step of every lookup.
        std::unordered_map<Names, size_t, NamesHash> seen;
        seen.reserve(framed.size());
        std::unordered_map<Names, size_t, NamesHash> group_index;
        std::vector<std::vector<const Framed *>> groups;
        // Later occurrences, by occurrence number, each in claim order.
        std::vector<std::vector<const Framed *>> repeats;
        for (const Framed &f : framed) {
            const ClaimedTimer &t = rows_[f.row];
            // The empty txn is no exception: the fire refuses a segment whose hashes repeat,
            // whatever the txn, so two empty ones must not share a segment either.
            const size_t occurrence = seen[{t.tenant, t.queue, t.txn}]++;
            if (occurrence > 0) {
                if (repeats.size() < occurrence) repeats.resize(occurrence);
                repeats[occurrence - 1].push_back(&f);
                continue;
            }
            auto [it, inserted] =
                group_index.try_emplace(Names{t.tenant, t.queue, t.partition}, groups.size());
            if (inserted) groups.emplace_back();
            groups[it->second].push_back(&f);
        }
        for (const auto &group : groups) split_group(group);
        // A repeat is alone in its segment: log_timers_fire_v2 refuses a segment that repeats
        // a hash and answers `duplicate` per segment, releasing the innocent rows with the
        // guilty one. Its round comes after every segment that can hold the occurrence before
        // it, so the dedup check sees the first occurrence first.
        for (const auto &round : repeats)
            for (const Framed *f : round) emit(std::vector<const Framed *>{f});
    }

    // Cuts a group where its raw frames and hashes would pass the cap; a frame over the cap
    // on its own still gets a segment.
    void split_group(const std::vector<const Framed *> &group) {
        std::vector<const Framed *> current;
        size_t current_bytes = 0;
        for (const Framed *f : group) {
            if (!current.empty() && f->frame_bytes > max_ - std::min(max_, current_bytes)) {
                emit(current);
                current.clear();
                current_bytes = 0;
            }
            current.push_back(f);
            current_bytes += f->frame_bytes;
        }
        if (!current.empty()) emit(current);
    }

    // Builds one segment; if zstd made a multi-frame segment bigger than the cap (it can, a
    // little, on incompressible payloads), halves it so only a lone timer may pass the cap.
    void emit(const std::vector<const Framed *> &frames) {
        const ClaimedTimer &first = rows_[frames.front()->row];
        PackedSegment seg;
        seg.tenant = first.tenant;
        seg.queue = first.queue;
        seg.partition = first.partition;
        std::string raw;
        size_t raw_bytes = 0;
        for (const Framed *f : frames) raw_bytes += f->frame_bytes - kTxnHashBytes;
        raw.reserve(raw_bytes);
        seg.hashes.reserve(frames.size() * kTxnHashBytes);
        seg.rows.reserve(frames.size());
        for (const Framed *f : frames) {
            const ClaimedTimer &t = rows_[f->row];
            append_frame(raw, view_of(t, f->payload));
            append_txn_hash(seg.hashes, t.txn);
            seg.rows.push_back(f->row);
        }
        seg.blob = compress_segment(raw);
        seg.count = static_cast<uint32_t>(frames.size());
        seg.bytes = seg.blob.size() + seg.hashes.size();
        if (seg.bytes > max_ && frames.size() > 1) {
            const size_t half = frames.size() / 2;
            emit(std::vector<const Framed *>(frames.begin(), frames.begin() + half));
            emit(std::vector<const Framed *>(frames.begin() + half, frames.end()));
            return;
        }
        segments_.push_back(std::move(seg));
    }

    void batch() {
        for (PackedSegment &seg : segments_) {
            auto &batches = result_.batches;
            if (batches.empty() || (!batches.back().segments.empty() &&
                                    seg.bytes > max_ - std::min(max_, batches.back().bytes)))
                batches.emplace_back();
            batches.back().bytes += seg.bytes;
            batches.back().segments.push_back(std::move(seg));
        }
        segments_.clear();
    }

    const std::vector<ClaimedTimer> &rows_;
    const size_t max_;
    size_t inflate_left_;
    bool inflated_any_ = false;  // the first zstd row always inflates: progress is guaranteed
    // Decompressed payload_zstd payloads, by row; sized once so views into it stay valid.
    std::vector<std::string> inflated_;
    std::vector<PackedSegment> segments_;
    PackResult result_;
};

}  // namespace

size_t inflate_budget(size_t max_fire_bytes) {
    const size_t lo = size_t{4} << 20, hi = size_t{64} << 20;
    return std::clamp(max_fire_bytes > hi ? hi : 2 * max_fire_bytes, lo, hi);
}

std::atomic<void (*)()> g_test_on_pack{nullptr};

PackResult pack_timers(const std::vector<ClaimedTimer> &rows, size_t max_fire_bytes, size_t budget) {
    if (auto *seam = g_test_on_pack.load(std::memory_order_relaxed)) seam();
    return Packer(rows, max_fire_bytes, budget).run();
}

PackResult pack_timers(const std::vector<ClaimedTimer> &rows, size_t max_fire_bytes) {
    return pack_timers(rows, max_fire_bytes, inflate_budget(max_fire_bytes));
}

}  // namespace qsw
