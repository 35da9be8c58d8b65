// One partition's ring and the per-group cursors over it.
//
// A ring holds messages with contiguous offsets [base, next_offset): messages
// only ever leave from the head (trim, ttl, overflow), so an offset maps to a
// deque index by subtraction. A group's cursor remembers three things: the
// first offset it has never been given (`next`), the deliveries it has open
// (leased or visible again), and nothing else: an offset below `next` with no
// open delivery is done for the group. That makes "every group is past this
// message" a comparison against each cursor's floor.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

namespace ephemeral_engine {

struct Message {
    int64_t offset = 0;
    int64_t pushed_ms = 0;
    size_t len = 0;
    std::unique_ptr<uint8_t[]> bytes;
};

struct Delivery {
    uint32_t attempts = 0;
    uint64_t lease_id = 0;
    int64_t lease_expires = 0;
    bool leased = false;
};

// What maintenance did; summed into the engine's totals and the sweep result.
struct Tally {
    uint64_t redelivered = 0;
    uint64_t exhausted = 0;
    uint64_t ttl_dropped = 0;
    uint64_t bytes_released = 0;
    uint64_t messages_released = 0;
};

struct Cursor {
    int64_t next = 0;
    std::map<int64_t, Delivery> open;               // offsets below next, delivered, not done
    std::set<int64_t> ready;                        // open and visible again
    std::set<std::pair<int64_t, int64_t>> leases;   // (expires, offset) of open and leased
    std::unordered_map<uint64_t, int64_t> by_lease; // latest lease id -> offset

    int64_t floor() const { return open.empty() ? next : open.begin()->first; }

    // Forget an offset entirely (done, exhausted or dropped).
    void close(int64_t offset);
    // A lease lapsed or a retry was asked: visible again, or exhausted past the limit.
    // Returns true when it was exhausted (and closed).
    bool release(int64_t offset, uint32_t max_retries);
};

struct Ring {
    std::deque<Message> messages;
    int64_t next_offset = 0;
    std::map<std::string, Cursor, std::less<>> cursors; // by group

    int64_t base() const { return messages.empty() ? next_offset : messages.front().offset; }
    const Message *find(int64_t offset) const;

    // Remove the head message whatever the groups think (ttl, overflow).
    void drop_head(Tally &t);
    // Remove head messages every group is done with. No group means no trim:
    // messages wait for the first consumer.
    void trim(Tally &t);
    // Lease expiry for every group, then ttl head-drop, then trim.
    void maintain(int64_t now, uint64_t ttl_ms, uint32_t max_retries, Tally &t);
    // Nearest lease or ttl instant, or INT64_MAX.
    int64_t next_expiry(uint64_t ttl_ms) const;
    uint64_t in_flight() const;
};

} // namespace ephemeral_engine
