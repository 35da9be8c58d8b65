#include "ring.hpp"

#include <algorithm>
#include <limits>

namespace ephemeral_engine {

void Cursor::close(int64_t offset) {
    auto it = open.find(offset);
    if (it == open.end()) return;
    const Delivery &d = it->second;
    if (d.leased) leases.erase({d.lease_expires, offset});
    else ready.erase(offset);
    auto lb = by_lease.find(d.lease_id);
    if (lb != by_lease.end() && lb->second == offset) by_lease.erase(lb);
    open.erase(it);
}

bool Cursor::release(int64_t offset, uint32_t max_retries) {
    auto it = open.find(offset);
    if (it == open.end()) return false;
    Delivery &d = it->second;
    if (d.leased) {
        leases.erase({d.lease_expires, offset});
        d.leased = false;
    }
    // attempts counts deliveries: the first one plus max_retries redeliveries.
    if (d.attempts > max_retries) {
        close(offset);
        return true;
    }
    ready.insert(offset);
    return false;
}

const Message *Ring::find(int64_t offset) const {
    const int64_t b = base();
    if (offset < b || offset >= next_offset) return nullptr;
    return &messages[static_cast<size_t>(offset - b)];
}

void Ring::drop_head(Tally &t) {
    const Message &m = messages.front();
    const int64_t off = m.offset;
    t.bytes_released += m.len;
    t.messages_released += 1;
    messages.pop_front();
    // Whatever a group had open on it is gone; a later ack gets ENOENT.
    for (auto &[name, c] : cursors) {
        c.close(off);
        if (c.next <= off) c.next = off + 1;
    }
}

void Ring::trim(Tally &t) {
    if (cursors.empty()) return;
    while (!messages.empty()) {
        const int64_t off = messages.front().offset;
        for (const auto &[name, c] : cursors)
            if (c.floor() <= off) return;
        t.bytes_released += messages.front().len;
        t.messages_released += 1;
        messages.pop_front();
    }
}

void Ring::maintain(int64_t now, uint64_t ttl_ms, uint32_t max_retries, Tally &t) {
    for (auto &[name, c] : cursors) {
        while (!c.leases.empty() && c.leases.begin()->first <= now) {
            const int64_t off = c.leases.begin()->second;
            if (c.release(off, max_retries)) t.exhausted += 1;
            else t.redelivered += 1;
        }
    }
    if (ttl_ms > 0) {
        // Saturating: a ttl near INT64_MAX means "practically never", not overflow.
        while (!messages.empty() && now - messages.front().pushed_ms >= 0 &&
               static_cast<uint64_t>(now - messages.front().pushed_ms) >= ttl_ms) {
            drop_head(t);
            t.ttl_dropped += 1;
        }
    }
    trim(t);
}

int64_t Ring::next_expiry(uint64_t ttl_ms) const {
    int64_t best = std::numeric_limits<int64_t>::max();
    for (const auto &[name, c] : cursors)
        if (!c.leases.empty()) best = std::min(best, c.leases.begin()->first);
    if (ttl_ms > 0 && !messages.empty()) {
        const int64_t pushed = messages.front().pushed_ms;
        const uint64_t room = static_cast<uint64_t>(std::numeric_limits<int64_t>::max() - pushed);
        if (ttl_ms < room) best = std::min(best, pushed + static_cast<int64_t>(ttl_ms));
    }
    return best;
}

uint64_t Ring::in_flight() const {
    uint64_t n = 0;
    for (const auto &[name, c] : cursors) n += c.leases.size();
    return n;
}

} // namespace ephemeral_engine
