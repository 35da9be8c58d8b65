// The claims this sweeper holds: (tenant, queue, timer key) -> claim token. A row is
// entered the moment its claim is decoded and leaves when it is fired, failed or handed
// back, so whatever happens in between (a stop, a lost connection, an error) it is still
// named here and can be handed back token-matched instead of waiting out its lease.
//
// Every claimed row passes through here twice (held, then forgotten), so this is on the
// drain's hot path: one hash table keyed by the three names joined with NUL (a byte no
// PostgreSQL text value can hold, so two different triples never join to the same key),
// and lookups build their key in a reused buffer, so holding and forgetting a row cost one
// allocation for the entry and none for the lookup. Only the loop thread touches it.
#pragma once
#include <string>
#include <string_view>
#include <unordered_map>

#include "codec/packer.hpp"

namespace qsw {

class HeldClaims {
public:
    void hold(const ClaimedTimer &t) { held_.insert_or_assign(key(t.tenant, t.queue, t.timer_key), t.claim_token); }
    void forget(const ClaimedTimer &t) { forget(t.tenant, t.queue, t.timer_key); }
    void forget(std::string_view tenant, std::string_view queue, std::string_view timer_key) {
        auto it = held_.find(lookup(tenant, queue, timer_key));
        if (it != held_.end()) held_.erase(it);
    }
    bool holds(const ClaimedTimer &t) const { return held_.count(lookup(t.tenant, t.queue, t.timer_key)) != 0; }
    bool empty() const { return held_.empty(); }
    size_t size() const { return held_.size(); }
    void clear() { held_.clear(); }

    // Every held claim, as fn(tenant, queue, timer_key, claim_token); order unspecified.
    template <class Fn>
    void for_each(Fn &&fn) const {
        for (const auto &[k, token] : held_) {
            const std::string_view s(k);
            const size_t a = s.find('\0'), b = s.find('\0', a + 1);
            fn(s.substr(0, a), s.substr(a + 1, b - a - 1), s.substr(b + 1), std::string_view(token));
        }
    }

private:
    static void join(std::string &out, std::string_view tenant, std::string_view queue, std::string_view timer_key) {
        out.clear();
        out.reserve(tenant.size() + queue.size() + timer_key.size() + 2);
        out.append(tenant).push_back('\0');
        out.append(queue).push_back('\0');
        out.append(timer_key);
    }
    static std::string key(std::string_view tenant, std::string_view queue, std::string_view timer_key) {
        std::string k;
        join(k, tenant, queue, timer_key);
        return k;
    }
    const std::string &lookup(std::string_view tenant, std::string_view queue, std::string_view timer_key) const {
        join(scratch_, tenant, queue, timer_key);
        return scratch_;
    }

    std::unordered_map<std::string, std::string> held_;
    mutable std::string scratch_;  // the lookup key, reused
};

}  // namespace qsw
