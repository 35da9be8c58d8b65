// Partitions' row addresses from the fires (see partition_addresses.hpp).
#include "sweeper/partition_addresses.hpp"

namespace qsw {

std::string partition_key(std::string_view tenant, std::string_view queue, std::string_view partition) {
    std::string k;
    k.reserve(tenant.size() + queue.size() + partition.size() + 2);
    k.append(tenant);
    k += '\0';
    k.append(queue);
    k += '\0';
    k.append(partition);
    return k;
}

// An entry's bytes: its two strings and a map node's bookkeeping, roughly.
size_t PartitionAddresses::cost(const std::string &key, const std::string &tid) {
    return key.size() + tid.size() + 96;
}

std::string_view PartitionAddresses::find(std::string_view tenant, std::string_view queue,
                                          std::string_view partition) const {
    if (map_.empty()) return {};
    const auto it = map_.find(partition_key(tenant, queue, partition));
    return it == map_.end() ? std::string_view{} : std::string_view(it->second);
}

void PartitionAddresses::learn(std::string_view tenant, std::string_view queue, std::string_view partition,
                               std::string_view tid) {
    std::string k = partition_key(tenant, queue, partition);
    const auto it = map_.find(k);
    if (it != map_.end()) {
        bytes_ -= cost(it->first, it->second);
        if (tid.empty()) {
            map_.erase(it);
            return;
        }
        it->second.assign(tid);
        bytes_ += cost(it->first, it->second);
        return;
    }
    if (tid.empty()) return;
    std::string t(tid);
    const size_t c = cost(k, t);
    if (c > max_bytes_) return;  // an entry bigger than the bound is never kept
    if (bytes_ + c > max_bytes_) {
        map_.clear();
        bytes_ = 0;
        ++resets_;
    }
    bytes_ += c;
    map_.emplace(std::move(k), std::move(t));
}

}  // namespace qsw
