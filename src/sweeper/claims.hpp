// The claims this sweeper holds: (tenant, queue, timer key) -> claim token. A row is
// entered the moment its claim is decoded and leaves when it is fired, failed or handed
// back, so whatever happens in between (a stop, a lost connection, an error) it is still
// named here and can be handed back token-matched instead of waiting out its lease.
#pragma once
#include <map>
#include <string>
#include <tuple>

#include "codec/packer.hpp"

namespace qsw {

class HeldClaims {
public:
    using Key = std::tuple<std::string, std::string, std::string>;

    void hold(const ClaimedTimer &t) { held_[key(t)] = t.claim_token; }
    void forget(const ClaimedTimer &t) { held_.erase(key(t)); }
    void forget(const std::string &tenant, const std::string &queue, const std::string &timer_key) {
        held_.erase(Key{tenant, queue, timer_key});
    }
    bool holds(const ClaimedTimer &t) const { return held_.count(key(t)) != 0; }
    bool empty() const { return held_.empty(); }
    size_t size() const { return held_.size(); }
    void clear() { held_.clear(); }
    const std::map<Key, std::string> &all() const { return held_; }

private:
    static Key key(const ClaimedTimer &t) { return Key{t.tenant, t.queue, t.timer_key}; }
    std::map<Key, std::string> held_;
};

}  // namespace qsw
