// The claim book (see claim_book.hpp).
#include "sweeper/claim_book.hpp"

#include <utility>

namespace qsw {

const char *row_state_name(RowState s) {
    switch (s) {
    case RowState::claimed: return "claimed";
    case RowState::firing: return "firing";
    case RowState::kept: return "kept";
    case RowState::parked: return "parked";
    }
    return "?";
}

const char *row_event_name(RowEvent e) {
    switch (e) {
    case RowEvent::sent: return "sent";
    case RowEvent::busy: return "busy";
    case RowEvent::call_failed: return "call_failed";
    case RowEvent::answer_lost: return "answer_lost";
    case RowEvent::settled: return "settled";
    }
    return "?";
}

// The moves, state by state:
//   claimed: sent -> firing; answer_lost -> parked (a fail call of rows never fired); settled
//   firing:  busy -> kept; call_failed -> claimed; answer_lost -> parked; settled
//   kept:    sent -> firing; settled (its claim's deadline, a stop)
//   parked:  settled (the recovery: announced, handed back, or released unchecked)
// Anything else is refused: a row in two calls at once, a busy answer for a row in no call,
// a parked row sent again (its fire may have committed), a row settled twice.
RowMove row_next(RowState from, RowEvent e) {
    auto to = [](RowState s) { return RowMove{true, false, s}; };
    const RowMove out{true, true, from};
    const RowMove refused{false, false, from};
    if (e == RowEvent::settled) return out;
    switch (from) {
    case RowState::claimed:
        if (e == RowEvent::sent) return to(RowState::firing);
        if (e == RowEvent::answer_lost) return to(RowState::parked);
        return refused;
    case RowState::firing:
        if (e == RowEvent::busy) return to(RowState::kept);
        if (e == RowEvent::call_failed) return to(RowState::claimed);
        if (e == RowEvent::answer_lost) return to(RowState::parked);
        return refused;
    case RowState::kept:
        if (e == RowEvent::sent) return to(RowState::firing);
        return refused;
    case RowState::parked:
        return refused;
    }
    return refused;
}

const std::string &ClaimBook::lookup(std::string_view tenant, std::string_view queue, std::string_view timer_key,
                                     std::string_view token) const {
    scratch_.clear();
    scratch_.reserve(tenant.size() + queue.size() + timer_key.size() + token.size() + 3);
    scratch_.append(tenant).push_back('\0');
    scratch_.append(queue).push_back('\0');
    scratch_.append(timer_key).push_back('\0');
    scratch_.append(token);
    return scratch_;
}

void ClaimBook::refuse(std::string what) {
    ++figures_.refused_moves_total;
    refusal_ = std::move(what);
}

void ClaimBook::enter(const ClaimedTimer &t) {
    const auto [it, fresh] = rows_.try_emplace(lookup(t.tenant, t.queue, t.timer_key, t.claim_token), RowState::claimed);
    if (!fresh) {
        refuse("a row entered the claim book twice (it is " + std::string(row_state_name(it->second)) + ")");
        return;
    }
    ++figures_.by_state[static_cast<size_t>(RowState::claimed)];
}

bool ClaimBook::move(std::string_view tenant, std::string_view queue, std::string_view timer_key,
                     std::string_view token, RowEvent e) {
    auto it = rows_.find(lookup(tenant, queue, timer_key, token));
    if (it == rows_.end()) {
        refuse(std::string("a row not in the claim book was ") + row_event_name(e));
        return false;
    }
    const RowMove m = row_next(it->second, e);
    if (!m.legal) {
        refuse(std::string("a ") + row_state_name(it->second) + " row was " + row_event_name(e));
        return false;
    }
    --figures_.by_state[static_cast<size_t>(it->second)];
    if (m.leaves) {
        rows_.erase(it);
        return true;
    }
    it->second = m.next;
    ++figures_.by_state[static_cast<size_t>(m.next)];
    return true;
}

std::optional<RowState> ClaimBook::state_of(const ClaimedTimer &t) const {
    auto it = rows_.find(lookup(t.tenant, t.queue, t.timer_key, t.claim_token));
    if (it == rows_.end()) return std::nullopt;
    return it->second;
}

void ClaimBook::settle_all() {
    rows_.clear();
    figures_.by_state.fill(0);
}

}  // namespace qsw
