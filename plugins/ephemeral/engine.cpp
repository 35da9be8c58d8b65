#include "engine.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace ephemeral_engine {

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

Error fail(int status, std::string message) { return Error{status, std::move(message)}; }

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

int64_t add_saturating(int64_t at, uint64_t ms) {
    const uint64_t room = static_cast<uint64_t>(kNever - at);
    return ms >= room ? kNever : at + static_cast<int64_t>(ms);
}

struct FreeDeleter {
    void operator()(uint8_t *p) const { std::free(p); }
};

} // namespace

Error validate_config(const queen_ephemeral_config &cfg) {
    if (cfg.overflow != QUEEN_EPHEMERAL_OVERFLOW_REJECT &&
        cfg.overflow != QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST)
        return fail(QUEEN_EPHEMERAL_EINVAL, "config.overflow must be QUEEN_EPHEMERAL_OVERFLOW_REJECT (0) "
                                            "or QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST (1), got " +
                                                std::to_string(cfg.overflow));
    if (cfg.lease_ms == 0) return fail(QUEEN_EPHEMERAL_EINVAL, "config.lease_ms must be > 0");
    if (cfg.max_payload_bytes == 0)
        return fail(QUEEN_EPHEMERAL_EINVAL, "config.max_payload_bytes must be > 0");
    return {};
}

Engine::Engine(const queen_ephemeral_config &cfg) : cfg_(cfg) {
    defaults_.max_bytes = cfg.queue_max_bytes;
    defaults_.max_messages = cfg.queue_max_messages;
    defaults_.overflow = cfg.overflow;
    defaults_.lease_ms = cfg.lease_ms;
    defaults_.max_retries = cfg.max_retries;
    defaults_.ttl_ms = cfg.ttl_ms;
}

Error Engine::resolve(const queen_ephemeral_queue_options *opts, QueueSettings &out) const {
    out = defaults_;
    if (!opts) return {};
    if (opts->struct_size < sizeof(queen_ephemeral_queue_options))
        return fail(QUEEN_EPHEMERAL_EINVAL, "opts.struct_size is " + std::to_string(opts->struct_size) +
                                                ", smaller than the ABI 1.0 struct (" +
                                                std::to_string(sizeof(queen_ephemeral_queue_options)) +
                                                "); call queen_ephemeral_queue_options_init()");
    auto field = [](const char *name, int64_t v, int64_t lo, int64_t hi, auto &dst) -> Error {
        if (v == QUEEN_EPHEMERAL_INHERIT) return {};
        if (v < lo || v > hi)
            return fail(QUEEN_EPHEMERAL_EINVAL, std::string("opts.") + name + " must be between " +
                                                    std::to_string(lo) + " and " + std::to_string(hi) +
                                                    " or QUEEN_EPHEMERAL_INHERIT, got " +
                                                    std::to_string(v));
        dst = static_cast<std::remove_reference_t<decltype(dst)>>(v);
        return {};
    };
    constexpr int64_t i64max = std::numeric_limits<int64_t>::max();
    constexpr int64_t u32max = std::numeric_limits<uint32_t>::max();
    for (Error e : {field("max_bytes", opts->max_bytes, 0, i64max, out.max_bytes),
                    field("max_messages", opts->max_messages, 0, i64max, out.max_messages),
                    field("overflow", opts->overflow, QUEEN_EPHEMERAL_OVERFLOW_REJECT,
                          QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST, out.overflow),
                    field("lease_ms", opts->lease_ms, 1, u32max, out.lease_ms),
                    field("max_retries", opts->max_retries, 0, u32max, out.max_retries),
                    field("ttl_ms", opts->ttl_ms, 0, i64max, out.ttl_ms)})
        if (e.status != QUEEN_EPHEMERAL_OK) return e;
    return {};
}

std::shared_ptr<Queue> Engine::acquire(std::string_view name, bool create, int64_t now,
                                       std::unique_lock<std::mutex> &lock, Error &err) {
    const std::string key(name);
    for (;;) {
        std::shared_ptr<Queue> q;
        {
            std::shared_lock rl(map_mu_);
            auto it = queues_.find(key);
            if (it != queues_.end()) q = it->second;
        }
        if (!q) {
            if (!create) {
                err = fail(QUEEN_EPHEMERAL_ENOENT, "queue " + quoted(name) + " does not exist");
                return nullptr;
            }
            std::unique_lock wl(map_mu_);
            auto it = queues_.find(key);
            if (it != queues_.end()) {
                q = it->second;
            } else {
                if (cfg_.max_queues != 0 && queues_.size() >= cfg_.max_queues) {
                    totals_.rejected.fetch_add(1, std::memory_order_relaxed);
                    err = fail(QUEEN_EPHEMERAL_EFULL, "max_queues (" + std::to_string(cfg_.max_queues) +
                                                          ") reached: queue " + quoted(name) +
                                                          " cannot be created");
                    return nullptr;
                }
                q = std::make_shared<Queue>();
                q->name = key;
                q->settings = defaults_;
                q->last_touch = now;
                queues_.emplace(key, q);
            }
        }
        lock = std::unique_lock(q->mu);
        if (!q->dead) return q;
        lock.unlock(); // collected between lookup and lock: look again
    }
}

void Engine::release(Queue &q, const Tally &t) {
    if (t.messages_released == 0) return;
    q.bytes -= t.bytes_released;
    q.messages -= t.messages_released;
    bytes_.fetch_sub(t.bytes_released, std::memory_order_relaxed);
    messages_.fetch_sub(t.messages_released, std::memory_order_relaxed);
}

void Engine::account(const Tally &t) {
    if (t.redelivered) totals_.redelivered.fetch_add(t.redelivered, std::memory_order_relaxed);
    if (t.exhausted) totals_.exhausted.fetch_add(t.exhausted, std::memory_order_relaxed);
    if (t.ttl_dropped) totals_.ttl_dropped.fetch_add(t.ttl_dropped, std::memory_order_relaxed);
}

Tally Engine::maintain(Queue &q, int64_t now) {
    Tally t;
    for (auto &[name, r] : q.rings) r.maintain(now, q.settings.ttl_ms, q.settings.max_retries, t);
    release(q, t);
    account(t);
    return t;
}

bool Engine::collectable(const Queue &q, int64_t now) const {
    return !q.declared && cfg_.idle_gc_ms != 0 && q.messages == 0 && now >= q.last_touch &&
           static_cast<uint64_t>(now - q.last_touch) >= cfg_.idle_gc_ms;
}

void Engine::touch(Queue &q, int64_t now) {
    maintain(q, now);
    if (collectable(q, now)) {
        // The sweep would have collected it; a touch finds the same fresh queue
        // it would have created, so behaviour does not depend on the sweep's timing.
        retire_offsets(q);
        q.rings.clear();
        q.groups.clear();
        totals_.collected.fetch_add(1, std::memory_order_relaxed);
    }
    q.last_touch = std::max(q.last_touch, now);
}

void Engine::retire_offsets(const Queue &q) {
    int64_t high = 0;
    for (const auto &[name, r] : q.rings) high = std::max(high, r.next_offset);
    int64_t cur = offset_origin_.load(std::memory_order_relaxed);
    while (high > cur && !offset_origin_.compare_exchange_weak(cur, high, std::memory_order_relaxed)) {
    }
}

Ring &Engine::ring_for(Queue &q, std::string_view partition) {
    auto it = q.rings.find(partition);
    if (it != q.rings.end()) return it->second;
    // Relaxed is enough: the ring this one replaces was retired either under
    // this queue's lock (in place) or, by the sweep, under the map's exclusive
    // lock before the queue left the map, and a recreated queue is only found
    // through the map after that. Either way the raise happens before this load.
    Ring fresh;
    fresh.next_offset = offset_origin_.load(std::memory_order_relaxed);
    Ring &r = q.rings.emplace(std::string(partition), std::move(fresh)).first->second;
    // A known group starts at the new ring's first offset: a cursor left at 0
    // would hold back trimming for ever (its floor below every message).
    for (const auto &group : q.groups) {
        Cursor c;
        c.next = r.next_offset;
        r.cursors.emplace(group, std::move(c));
    }
    return r;
}

bool Engine::evict_oldest(Queue &q) {
    Ring *oldest = nullptr;
    for (auto &[name, r] : q.rings)
        if (!r.messages.empty() &&
            (!oldest || r.messages.front().pushed_ms < oldest->messages.front().pushed_ms))
            oldest = &r;
    if (!oldest) return false;
    Tally t;
    oldest->drop_head(t);
    oldest->trim(t);
    release(q, t);
    totals_.overflow_dropped.fetch_add(1, std::memory_order_relaxed);
    return true;
}

Error Engine::reserve_engine(Queue &q, size_t len) {
    for (;;) {
        const char *bound = nullptr;
        uint64_t limit = 0;
        uint64_t m = messages_.load(std::memory_order_relaxed);
        if (cfg_.max_messages != 0 && m + 1 > cfg_.max_messages) {
            bound = "max_messages";
            limit = cfg_.max_messages;
        } else if (!messages_.compare_exchange_weak(m, m + 1, std::memory_order_relaxed)) {
            continue;
        } else {
            uint64_t b = bytes_.load(std::memory_order_relaxed);
            for (;;) {
                if (cfg_.max_bytes != 0 && b + len > cfg_.max_bytes) {
                    messages_.fetch_sub(1, std::memory_order_relaxed);
                    bound = "max_bytes";
                    limit = cfg_.max_bytes;
                    break;
                }
                if (bytes_.compare_exchange_weak(b, b + len, std::memory_order_relaxed)) return {};
            }
        }
        // Under drop-oldest the pushing queue pays for its own room: one queue
        // never evicts another's messages.
        if (cfg_.overflow == QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST && evict_oldest(q)) continue;
        totals_.rejected.fetch_add(1, std::memory_order_relaxed);
        return fail(QUEEN_EPHEMERAL_EFULL, std::string("engine ") + bound + " (" + std::to_string(limit) +
                                               ") reached: push to queue " + quoted(q.name) +
                                               " rejected");
    }
}

Error Engine::declare(std::string_view queue, const queen_ephemeral_queue_options *opts) {
    QueueSettings s;
    if (Error e = resolve(opts, s); e.status != QUEEN_EPHEMERAL_OK) return e;
    std::unique_lock<std::mutex> lock;
    Error err;
    auto q = acquire(queue, true, 0, lock, err);
    if (!q) return err;
    q->declared = true;
    q->settings = s;
    return {};
}

Error Engine::push(std::string_view queue, std::string_view partition, const void *payload,
                   size_t len, int64_t now, int64_t *out_offset) {
    // Copy before taking any lock or reserving anything: nothing to undo on ENOMEM.
    std::unique_ptr<uint8_t[]> bytes;
    if (len > 0) {
        bytes.reset(new uint8_t[len]);
        std::memcpy(bytes.get(), payload, len);
    }
    int64_t armed = kNever;
    int64_t offset = 0;
    {
        std::unique_lock<std::mutex> lock;
        Error err;
        auto q = acquire(queue, true, now, lock, err);
        if (!q) return err;
        touch(*q, now);
        const QueueSettings &s = q->settings;
        auto reject = [&](const char *bound, uint64_t limit, const std::string &why) {
            totals_.rejected.fetch_add(1, std::memory_order_relaxed);
            return fail(QUEEN_EPHEMERAL_EFULL, std::string(bound) + " (" + std::to_string(limit) + ") of queue " +
                                                   quoted(queue) + " " + why);
        };
        // A payload no amount of eviction could make room for is refused before
        // anything is evicted for it.
        if (s.max_bytes != 0 && len > s.max_bytes)
            return reject("queue_max_bytes", s.max_bytes,
                          "is smaller than the payload (" + std::to_string(len) + " bytes)");
        if (cfg_.max_bytes != 0 && len > cfg_.max_bytes) {
            totals_.rejected.fetch_add(1, std::memory_order_relaxed);
            return fail(QUEEN_EPHEMERAL_EFULL, "engine max_bytes (" + std::to_string(cfg_.max_bytes) +
                                                   ") is smaller than the payload (" + std::to_string(len) +
                                                   " bytes)");
        }
        for (;;) {
            const bool over_count = s.max_messages != 0 && q->messages + 1 > s.max_messages;
            const bool over_bytes = s.max_bytes != 0 && q->bytes + len > s.max_bytes;
            if (!over_count && !over_bytes) break;
            if (s.overflow == QUEEN_EPHEMERAL_OVERFLOW_REJECT || !evict_oldest(*q))
                return over_count ? reject("queue_max_messages", s.max_messages, "reached")
                                  : reject("queue_max_bytes", s.max_bytes, "reached");
        }
        Ring &r = ring_for(*q, partition);
        if (Error e = reserve_engine(*q, len); e.status != QUEEN_EPHEMERAL_OK) return e;
        offset = r.next_offset;
        try {
            r.messages.push_back(Message{offset, now, len, std::move(bytes)});
        } catch (...) {
            messages_.fetch_sub(1, std::memory_order_relaxed);
            bytes_.fetch_sub(len, std::memory_order_relaxed);
            throw;
        }
        r.next_offset = offset + 1;
        q->bytes += len;
        q->messages += 1;
        totals_.pushed.fetch_add(1, std::memory_order_relaxed);
        if (s.ttl_ms != 0) armed = add_saturating(now, s.ttl_ms);
    }
    if (armed != kNever) hint(armed);
    if (out_offset) *out_offset = offset;
    return {};
}

Error Engine::pop(std::string_view queue, std::string_view partition, std::string_view group,
                  uint32_t lease_ms, int64_t now, PopResult &out) {
    int64_t armed = kNever;
    {
        std::unique_lock<std::mutex> lock;
        Error err;
        auto q = acquire(queue, true, now, lock, err);
        if (!q) return err;
        touch(*q, now);
        Ring &r = ring_for(*q, partition);
        if (q->groups.find(group) == q->groups.end()) {
            if (cfg_.max_groups != 0 && q->groups.size() >= cfg_.max_groups) {
                totals_.rejected.fetch_add(1, std::memory_order_relaxed);
                return fail(QUEEN_EPHEMERAL_EFULL, "max_groups (" + std::to_string(cfg_.max_groups) +
                                                       ") of queue " + quoted(queue) + " reached: group " +
                                                       quoted(group) + " cannot be created");
            }
            const std::string g(group);
            q->groups.emplace(g);
            // A new group starts at each ring's oldest held message.
            for (auto &[name, ring] : q->rings) {
                Cursor c;
                c.next = ring.base();
                ring.cursors.emplace(g, std::move(c));
            }
        }
        Cursor &c = r.cursors.find(group)->second;
        const bool redelivery = !c.ready.empty();
        int64_t offset;
        if (redelivery) {
            offset = *c.ready.begin();
        } else if (c.next < r.next_offset) {
            offset = std::max(c.next, r.base());
        } else {
            return fail(QUEEN_EPHEMERAL_EAGAIN, "nothing to pop from queue " + quoted(queue) +
                                                    " partition " + quoted(partition) + " for group " +
                                                    quoted(group));
        }
        const Message *m = r.find(offset);
        if (!m) return fail(QUEEN_EPHEMERAL_EINTERNAL, "open delivery of offset " + std::to_string(offset) +
                                                           " has no message in its ring");
        std::unique_ptr<uint8_t, FreeDeleter> copy;
        if (m->len > 0) {
            copy.reset(static_cast<uint8_t *>(std::malloc(m->len)));
            if (!copy) throw std::bad_alloc();
            std::memcpy(copy.get(), m->bytes.get(), m->len);
        }
        Delivery &d = c.open[offset]; // may allocate: before any other change
        if (redelivery) {
            c.ready.erase(offset);
            auto lb = c.by_lease.find(d.lease_id);
            if (lb != c.by_lease.end() && lb->second == offset) c.by_lease.erase(lb);
        } else {
            c.next = offset + 1;
        }
        d.attempts += 1;
        d.lease_id = lease_seq_.fetch_add(1, std::memory_order_relaxed) + 1;
        d.lease_expires = now + static_cast<int64_t>(lease_ms != 0 ? lease_ms : q->settings.lease_ms);
        d.leased = true;
        c.leases.emplace(d.lease_expires, offset);
        c.by_lease[d.lease_id] = offset;
        totals_.popped.fetch_add(1, std::memory_order_relaxed);

        out.offset = offset;
        out.lease_id = d.lease_id;
        out.attempt = d.attempts;
        out.lease_expires = d.lease_expires;
        out.pushed_ms = m->pushed_ms;
        out.len = m->len;
        out.payload = copy.release();
        armed = d.lease_expires;
    }
    hint(armed);
    return {};
}

Error Engine::ack(std::string_view queue, std::string_view partition, std::string_view group,
                  int64_t offset, uint64_t lease_id, int outcome, int64_t now) {
    std::unique_lock<std::mutex> lock;
    Error err;
    auto q = acquire(queue, false, now, lock, err);
    if (!q) return err;
    touch(*q, now);
    auto rit = q->rings.find(partition);
    if (rit == q->rings.end())
        return fail(QUEEN_EPHEMERAL_ENOENT, "partition " + quoted(partition) + " of queue " + quoted(queue) +
                                                " does not exist");
    Ring &r = rit->second;
    auto cit = r.cursors.find(group);
    if (cit == r.cursors.end())
        return fail(QUEEN_EPHEMERAL_ENOENT, "group " + quoted(group) + " has never popped queue " + quoted(queue));
    Cursor &c = cit->second;
    if (offset < 0) {
        auto lb = c.by_lease.find(lease_id);
        if (lb == c.by_lease.end())
            return fail(QUEEN_EPHEMERAL_ENOENT, "lease " + std::to_string(lease_id) + " is not open for group " +
                                                    quoted(group) + " (settled, superseded, exhausted or dropped)");
        offset = lb->second;
    }
    auto it = c.open.find(offset);
    if (it == c.open.end())
        return fail(QUEEN_EPHEMERAL_ENOENT, "offset " + std::to_string(offset) + " is not open for group " +
                                                quoted(group) +
                                                " (never delivered, already settled, exhausted or dropped)");
    if (lease_id != 0 && it->second.lease_id != lease_id)
        return fail(QUEEN_EPHEMERAL_ESTALE, "lease " + std::to_string(lease_id) + " of offset " +
                                                std::to_string(offset) + " was superseded by lease " +
                                                std::to_string(it->second.lease_id));
    Tally t;
    switch (outcome) {
    case QUEEN_EPHEMERAL_ACK_COMPLETED:
        c.close(offset);
        totals_.acked.fetch_add(1, std::memory_order_relaxed);
        break;
    case QUEEN_EPHEMERAL_ACK_FAILED:
        c.close(offset);
        totals_.failed.fetch_add(1, std::memory_order_relaxed);
        break;
    default: // QUEEN_EPHEMERAL_ACK_RETRY, checked by the shim
        if (!it->second.leased) break; // already visible again
        if (c.release(offset, q->settings.max_retries)) t.exhausted += 1;
        else totals_.retried.fetch_add(1, std::memory_order_relaxed);
        break;
    }
    r.trim(t);
    release(*q, t);
    account(t);
    return {};
}

SweepResult Engine::sweep(int64_t now) {
    // Every instant announced so far is this pass's business now; from here
    // on, anything armed earlier than what the pass reports rings again.
    promised_.store(kNever, std::memory_order_relaxed);
    std::vector<std::shared_ptr<Queue>> all;
    {
        std::shared_lock rl(map_mu_);
        all.reserve(queues_.size());
        for (const auto &[name, q] : queues_) all.push_back(q);
    }
    SweepResult res;
    int64_t next = kNever;
    std::vector<std::shared_ptr<Queue>> idle;
    for (const auto &q : all) {
        std::lock_guard lk(q->mu);
        if (q->dead) continue;
        const Tally t = maintain(*q, now);
        res.redelivered += t.redelivered;
        res.exhausted += t.exhausted;
        res.ttl_dropped += t.ttl_dropped;
        if (collectable(*q, now)) {
            idle.push_back(q);
            continue;
        }
        for (const auto &[name, r] : q->rings) next = std::min(next, r.next_expiry(q->settings.ttl_ms));
    }
    for (const auto &q : idle) {
        std::unique_lock wl(map_mu_);
        std::lock_guard lk(q->mu);
        // A touch may have landed between the two locks.
        if (q->dead || !collectable(*q, now)) continue;
        retire_offsets(*q);
        queues_.erase(q->name);
        q->dead = true;
        res.collected += 1;
    }
    if (res.collected) totals_.collected.fetch_add(res.collected, std::memory_order_relaxed);
    res.next_expiry = next == kNever ? -1 : next;
    int64_t cur = promised_.load(std::memory_order_relaxed);
    while (next < cur && !promised_.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
    }
    return res;
}

void Engine::hint(int64_t at) {
    int64_t cur = promised_.load(std::memory_order_relaxed);
    do {
        if (at >= cur) return;
    } while (!promised_.compare_exchange_weak(cur, at, std::memory_order_relaxed));
    // Held shared while calling: a detach (exclusive) waits for this call, so
    // after it returns the old waker is never called.
    std::shared_lock lk(waker_mu_);
    if (wake_) wake_(wake_ctx_, at);
}

void Engine::attach_waker(queen_ephemeral_wake_fn wake, void *ctx) {
    std::unique_lock lk(waker_mu_);
    wake_ = wake;
    wake_ctx_ = wake ? ctx : nullptr;
    // A new owner has been promised nothing yet.
    promised_.store(kNever, std::memory_order_relaxed);
}

Error Engine::queue_info(std::string_view queue, QueueInfo &out) {
    std::shared_ptr<Queue> q;
    {
        std::shared_lock rl(map_mu_);
        auto it = queues_.find(std::string(queue));
        if (it == queues_.end())
            return fail(QUEEN_EPHEMERAL_ENOENT, "queue " + quoted(queue) + " does not exist");
        q = it->second;
    }
    std::lock_guard lk(q->mu);
    if (q->dead) return fail(QUEEN_EPHEMERAL_ENOENT, "queue " + quoted(queue) + " does not exist");
    out.declared = q->declared;
    out.partitions = static_cast<uint32_t>(q->rings.size());
    out.groups = static_cast<uint32_t>(q->groups.size());
    out.messages = q->messages;
    out.bytes = q->bytes;
    int64_t next = kNever;
    for (const auto &[name, r] : q->rings) {
        out.in_flight += r.in_flight();
        next = std::min(next, r.next_expiry(q->settings.ttl_ms));
    }
    out.next_expiry = next == kNever ? -1 : next;
    return {};
}

std::string Engine::stats_json() {
    std::vector<std::shared_ptr<Queue>> all;
    {
        std::shared_lock rl(map_mu_);
        for (const auto &[name, q] : queues_) all.push_back(q);
    }
    uint64_t declared = 0, in_flight = 0, queues = 0;
    for (const auto &q : all) {
        std::lock_guard lk(q->mu);
        if (q->dead) continue;
        queues += 1;
        declared += q->declared ? 1 : 0;
        for (const auto &[name, r] : q->rings) in_flight += r.in_flight();
    }
    auto ld = [](const std::atomic<uint64_t> &a) { return a.load(std::memory_order_relaxed); };
    char buf[1024];
    const int n = std::snprintf(
        buf, sizeof buf,
        "{\"queues\":%" PRIu64 ",\"declared_queues\":%" PRIu64 ",\"messages\":%" PRIu64 ",\"bytes\":%" PRIu64
        ",\"in_flight\":%" PRIu64 ",\"max_bytes\":%" PRIu64 ",\"max_messages\":%" PRIu64
        ",\"pushed_total\":%" PRIu64 ",\"popped_total\":%" PRIu64 ",\"acked_total\":%" PRIu64
        ",\"retried_total\":%" PRIu64 ",\"failed_total\":%" PRIu64 ",\"redelivered_total\":%" PRIu64
        ",\"exhausted_total\":%" PRIu64 ",\"ttl_dropped_total\":%" PRIu64 ",\"overflow_dropped_total\":%" PRIu64
        ",\"collected_total\":%" PRIu64 ",\"rejected_total\":%" PRIu64 "}",
        queues, declared, ld(messages_), ld(bytes_), in_flight, static_cast<uint64_t>(cfg_.max_bytes),
        static_cast<uint64_t>(cfg_.max_messages), ld(totals_.pushed), ld(totals_.popped), ld(totals_.acked),
        ld(totals_.retried), ld(totals_.failed), ld(totals_.redelivered), ld(totals_.exhausted),
        ld(totals_.ttl_dropped), ld(totals_.overflow_dropped), ld(totals_.collected), ld(totals_.rejected));
    return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

} // namespace ephemeral_engine
