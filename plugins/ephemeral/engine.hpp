// The engine: a map of queues, each behind its own mutex.
//
// Lock order is map, then queue, and nothing else is ever held with a queue
// lock except the waker lock (taken last, briefly, and never held while a
// queue or the map is wanted). A touch (push, pop, ack) finds its queue under
// the shared map lock, lets it go, and works under the queue's lock alone, so
// different queues never contend. Only creating and collecting a queue take
// the map exclusively; a collected queue is marked dead so a touch that raced
// with the collection looks it up again instead of writing into an orphan.
#pragma once

#include "queen_ephemeral.h"
#include "ring.hpp"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace ephemeral_engine {

// A failure with a status for the C shim and a message naming the culprit.
struct Error {
    int status = QUEEN_EPHEMERAL_OK;
    std::string message;
};

// Effective settings of one queue: engine defaults with its declared overrides.
struct QueueSettings {
    uint64_t max_bytes = 0;
    uint64_t max_messages = 0;
    int32_t overflow = QUEEN_EPHEMERAL_OVERFLOW_REJECT;
    uint32_t lease_ms = 30000;
    uint32_t max_retries = 3;
    uint64_t ttl_ms = 0;
};

struct Queue {
    std::mutex mu;
    std::string name;
    bool dead = false;     // collected: removed from the map
    bool declared = false;
    QueueSettings settings;
    std::map<std::string, Ring, std::less<>> rings;
    std::set<std::string, std::less<>> groups; // known consumer groups
    int64_t last_touch = 0;
    uint64_t bytes = 0;
    uint64_t messages = 0;
};

struct Totals {
    std::atomic<uint64_t> pushed{0}, popped{0}, acked{0}, retried{0}, failed{0};
    std::atomic<uint64_t> redelivered{0}, exhausted{0}, ttl_dropped{0}, overflow_dropped{0};
    std::atomic<uint64_t> collected{0}, rejected{0};
};

struct PopResult {
    int64_t offset = 0;
    uint64_t lease_id = 0;
    uint32_t attempt = 0;
    int64_t lease_expires = 0;
    int64_t pushed_ms = 0;
    uint8_t *payload = nullptr; // malloc'd; freed by queen_ephemeral_message_free
    size_t len = 0;
};

struct SweepResult {
    uint64_t redelivered = 0, exhausted = 0, ttl_dropped = 0, collected = 0;
    int64_t next_expiry = -1;
};

struct QueueInfo {
    bool declared = false;
    uint32_t partitions = 0, groups = 0;
    uint64_t messages = 0, bytes = 0, in_flight = 0;
    int64_t next_expiry = -1;
};

// The config checks of queen_ephemeral_create(), naming the field at fault.
Error validate_config(const queen_ephemeral_config &cfg);

class Engine {
public:
    explicit Engine(const queen_ephemeral_config &cfg);

    Error declare(std::string_view queue, const queen_ephemeral_queue_options *opts);
    Error push(std::string_view queue, std::string_view partition, const void *payload, size_t len,
               int64_t now, int64_t *out_offset);
    Error pop(std::string_view queue, std::string_view partition, std::string_view group,
              uint32_t lease_ms, int64_t now, PopResult &out);
    Error ack(std::string_view queue, std::string_view partition, std::string_view group,
              int64_t offset, uint64_t lease_id, int outcome, int64_t now);
    SweepResult sweep(int64_t now);
    void attach_waker(queen_ephemeral_wake_fn wake, void *ctx);
    std::string stats_json();
    Error queue_info(std::string_view queue, QueueInfo &out);

    const queen_ephemeral_config &config() const { return cfg_; }

private:
    // Find (and optionally create) a queue, returned locked and alive.
    std::shared_ptr<Queue> acquire(std::string_view name, bool create, int64_t now,
                                   std::unique_lock<std::mutex> &lock, Error &err);
    // Maintenance on touch, plus the idle reset that keeps behaviour the same
    // whether or not the sweep got to an idle queue first.
    void touch(Queue &q, int64_t now);
    Tally maintain(Queue &q, int64_t now);
    bool collectable(const Queue &q, int64_t now) const;
    Ring &ring_for(Queue &q, std::string_view partition);
    // Before a queue's rings are dropped (collection, in place or by the
    // sweep): raise offset_origin_ past every offset they handed out.
    void retire_offsets(const Queue &q);
    bool evict_oldest(Queue &q);
    void release(Queue &q, const Tally &t);
    Error reserve_engine(Queue &q, size_t len);
    void account(const Tally &t);
    // Announce an armed instant; rings the waker only when it is earlier than
    // every instant announced since the last sweep.
    void hint(int64_t at);
    Error resolve(const queen_ephemeral_queue_options *opts, QueueSettings &out) const;

    queen_ephemeral_config cfg_;
    QueueSettings defaults_;

    std::shared_mutex map_mu_;
    std::unordered_map<std::string, std::shared_ptr<Queue>> queues_;

    std::atomic<uint64_t> bytes_{0};
    std::atomic<uint64_t> messages_{0};
    std::atomic<uint64_t> lease_seq_{0};
    // Where every ring created from now on starts its offsets: past the last
    // offset of every ring collection has dropped. A consumer that still holds
    // an offset of a collected ring can name it in an ack by offset alone
    // (lease id 0), and a recreated ring restarting at 0 would hand that very
    // offset to a new message, which the late ack would then settle. One
    // number for the whole engine, not one per (queue, partition): what
    // collection forgets must stay forgotten, or memory would grow with every
    // name ever used. The price is that a partition's first offset is 0 only
    // until the engine first collects a queue; offsets were never dense across
    // partitions anyway, only within one ring.
    std::atomic<int64_t> offset_origin_{0};
    Totals totals_;

    std::shared_mutex waker_mu_;
    queen_ephemeral_wake_fn wake_ = nullptr;
    void *wake_ctx_ = nullptr;
    std::atomic<int64_t> promised_{INT64_MAX};
};

} // namespace ephemeral_engine
