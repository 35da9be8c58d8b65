// The recovery's decisions (see recovery_policy.hpp).
#include "sweeper/recovery_policy.hpp"

#include <algorithm>

namespace qsw {

namespace {

// One decided fire: its committed segments announced, the rest left, still-present ones back.
InDoubtFirePlan plan_fire(size_t f, const ParkedFire &pf, const InDoubtSeen *seen) {
    InDoubtFirePlan fp;
    fp.fire = f;
    for (size_t s = 0; s < pf.segments.size(); ++s) {
        const InDoubtSeen &sn = seen[s];
        if (sn.present == 0 && sn.base >= 0 && !pf.segments[s].hashes.empty()) {
            fp.announce.emplace_back(s, sn.base);
            continue;
        }
        if (sn.present > 0) fp.release.push_back(s);
        fp.left.push_back(s);
    }
    if (pf.in_doubt && !pf.counted)
        fp.count = fp.announce.empty() ? InDoubtFirePlan::Count::not_fired : InDoubtFirePlan::Count::fired;
    return fp;
}

}  // namespace

InDoubtPlan plan_in_doubt(const std::vector<ParkedFire> &parked, const std::vector<InDoubtSeen> &seen) {
    InDoubtPlan plan;
    size_t flat = 0;
    for (size_t f = 0; f < parked.size(); ++f) {
        const ParkedFire &pf = parked[f];
        const size_t first = flat;
        flat += pf.segments.size();
        if (flat > seen.size()) break;  // not covered by the check: undecided
        const auto from = seen.begin() + static_cast<std::ptrdiff_t>(first);
        const auto to = seen.begin() + static_cast<std::ptrdiff_t>(flat);
        if (std::any_of(from, to, [](const InDoubtSeen &s) { return s.unlocked < s.present; }))
            continue;  // undecided: look again next cycle
        InDoubtFirePlan fp = plan_fire(f, pf, seen.data() + first);
        for (const auto &[s, base] : fp.announce) {
            (void)base;
            plan.fired_rows += pf.segments[s].count;
            ++plan.fired_segments;
        }
        if (fp.count == InDoubtFirePlan::Count::fired) ++plan.fired_calls;
        if (fp.count == InDoubtFirePlan::Count::not_fired) ++plan.not_fired_calls;
        plan.decided.push_back(std::move(fp));
    }
    return plan;
}

LinkStep link_step(Link from, LinkEvent e, bool server_known) {
    LinkStep st;
    st.next = from;
    switch (e) {
    case LinkEvent::call_lost:
        st.next = Link::lost;
        st.new_loss = from != Link::lost;
        break;
    case LinkEvent::disconnect_seen:
        if (server_known && from != Link::lost) return link_step(from, LinkEvent::call_lost, server_known);
        st.next = from == Link::lost ? Link::lost : Link::unidentified;
        break;
    case LinkEvent::identified:
        st.again = from == Link::lost;
        st.next = (from == Link::lost || from == Link::reconnected) ? Link::reconnected : Link::connected;
        break;
    case LinkEvent::fired:
        st.resumed = from == Link::lost || from == Link::reconnected;
        if (from == Link::lost) st.next = Link::unidentified;
        else if (from == Link::reconnected) st.next = Link::connected;
        break;
    }
    return st;
}

}  // namespace qsw
