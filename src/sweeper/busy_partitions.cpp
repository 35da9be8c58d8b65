// Partitions recently answered busy (see busy_partitions.hpp).
#include "sweeper/busy_partitions.hpp"

#include "sweeper/partition_addresses.hpp"

namespace qsw {

bool fire_waits_first(size_t segments, size_t busy_recently) { return segments > 0 && busy_recently >= segments; }

void BusyPartitions::note(std::string_view tenant, std::string_view queue, std::string_view partition,
                          uint64_t now_ms) {
    std::string k = partition_key(tenant, queue, partition);
    if (at_.size() >= kMaxEntries && at_.find(k) == at_.end()) at_.clear();
    at_[std::move(k)] = now_ms;
}

bool BusyPartitions::recent(std::string_view tenant, std::string_view queue, std::string_view partition,
                            uint64_t now_ms) const {
    if (at_.empty()) return false;
    const auto it = at_.find(partition_key(tenant, queue, partition));
    if (it == at_.end()) return false;
    if (now_ms < it->second) return true;  // a clock read before the answer's: still recent
    return now_ms - it->second < kRecentMs;
}

}  // namespace qsw
