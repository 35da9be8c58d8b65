// The partitions whose last fire by this sweeper came back busy (another broker's fire or a
// host's push held them), and when. Where several sweepers fire into the same partitions
// (one busy partition shared by a fleet), a fire that skips locked partitions first fires
// nothing and answers all busy, and only the retry that waits a little fires: two calls per
// batch, the whole batch's payloads sent and parsed twice (four sweepers on one partition,
// 50,000 timers: 57-60 fire calls, 16-19 segments busy, where one sweeper makes 33; with
// this, 48-51 and 6-8: tests/bench/fire --shapes 1). A batch whose every partition came back
// busy within the last kRecentMs is sent waiting at once instead (fire_waits_first), as the
// retry would be. Owned by the drain, on the loop thread. Bounded: past kMaxEntries
// everything is forgotten at once (the next busy answers teach it again).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace qsw {

// Whether a batch is fired waiting for its partitions at once: when it has segments and the
// partition of every one came back busy within the last second (a batch that shares one
// free partition with them still skips: the free one fires without waiting for the rest).
bool fire_waits_first(size_t segments, size_t busy_recently);

class BusyPartitions {
public:
    static constexpr size_t kMaxEntries = 4096;
    static constexpr uint64_t kRecentMs = 1000;

    // A fire answered the partition busy at loop time now_ms.
    void note(std::string_view tenant, std::string_view queue, std::string_view partition, uint64_t now_ms);
    // Whether it did within kRecentMs of now_ms.
    bool recent(std::string_view tenant, std::string_view queue, std::string_view partition, uint64_t now_ms) const;

    size_t size() const { return at_.size(); }

private:
    std::unordered_map<std::string, uint64_t> at_;
};

}  // namespace qsw
