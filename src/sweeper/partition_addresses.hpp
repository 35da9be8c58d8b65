// Where each partition's row of queen.log_partitions was after this sweeper's last fire of
// it (schema 37): the fire answers those addresses ("partitionTids") and takes a row still
// there at its address on the next fire of the partition, instead of looking it up by key,
// which under a snapshot held anywhere in the database walks every version of the row
// written since (docs/operations.md, "Long transactions"). Only a hint: the server checks
// that the row at the address is the partition's current row and looks up by key
// otherwise, so an address another writer made stale, or one from before a restore, costs
// one TID probe and nothing else. Owned by the drain, on the loop thread.
// Bounded in bytes: past the bound every address is forgotten at once (the next fires
// learn them again), so the memory never grows with the number of partitions a broker has.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace qsw {

// A partition's key in the drain's memories of partitions: tenant, queue and partition
// joined by NUL, which a PostgreSQL text value never holds (no two triples share one).
std::string partition_key(std::string_view tenant, std::string_view queue, std::string_view partition);

class PartitionAddresses {
public:
    // About 40,000 partitions at typical name lengths.
    static constexpr size_t kDefaultMaxBytes = size_t{4} << 20;
    explicit PartitionAddresses(size_t max_bytes = kDefaultMaxBytes) : max_bytes_(max_bytes) {}

    // The address last learnt for the partition, "(block,offset)"; empty: none known.
    std::string_view find(std::string_view tenant, std::string_view queue, std::string_view partition) const;
    // What a fire answered for the partition: an address (kept), or empty (forgotten: the
    // fire wrote no row of it, or its answer gave none).
    void learn(std::string_view tenant, std::string_view queue, std::string_view partition, std::string_view tid);

    size_t size() const { return map_.size(); }
    size_t bytes() const { return bytes_; }
    int64_t resets() const { return resets_; }  // times everything was forgotten for the bound

private:
    static size_t cost(const std::string &key, const std::string &tid);
    std::unordered_map<std::string, std::string> map_;
    size_t bytes_ = 0;
    size_t max_bytes_;
    int64_t resets_ = 0;
};

}  // namespace qsw
