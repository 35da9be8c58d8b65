// The recovery's decisions as pure functions (recovery.hpp does the calls): what to do
// with fires whose answer was lost once the in-doubt check has answered, and the link
// state the recovery keeps between a lost connection and the first fire after it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codec/packer.hpp"

namespace qsw {

// ---- The in-doubt settlement --------------------------------------------------------------

// A parked segment: rows of a fire whose answer was lost (hashes set: it may be in the
// log), or of a fail call whose answer was lost (hashes empty: nothing to look for).
struct ParkedSegment {
    std::string tenant, queue, partition;
    int64_t count = 0;
    std::string hashes;
    std::vector<size_t> rows;  // indexes into its fire's rows (ParkedFire::rows), frame order
};
// The rows are the claim's own (shared with it, never copied); their state, parked, is the
// claim book's.
struct ParkedFire {
    bool in_doubt = false;  // sent, answer lost: it may have committed
    bool counted = false;   // its resolution is in the stats already
    std::shared_ptr<const std::vector<ClaimedTimer>> rows;
    std::vector<ParkedSegment> segments;
};

// What the in-doubt check says of one parked segment: how many of its timers are still
// in the table, how many of those nobody holds a lock on, and the offset the log has the
// segment at (-1: not in the log).
struct InDoubtSeen {
    int64_t present = 0, unlocked = 0, base = -1;
};

// What to do with one decided parked fire (none of its timers locked by anyone).
struct InDoubtFirePlan {
    enum class Count { none, fired, not_fired };
    size_t fire = 0;                                  // index into the parked fires
    std::vector<std::pair<size_t, int64_t>> announce; // (segment, base offset): committed, announced once
    std::vector<size_t> release;                      // segments whose timers are still there: back
    std::vector<size_t> left;                         // segments not committed (release's and the rest)
    Count count = Count::none;                        // how the fire's resolution is counted (once)
};
struct InDoubtPlan {
    std::vector<InDoubtFirePlan> decided;  // in parked order; a fire not here is undecided
    int64_t fired_rows = 0, fired_segments = 0, fired_calls = 0, not_fired_calls = 0;
};

// `seen` holds one entry per parked segment, flattened in parked order (fire by fire). A
// fire any of whose timers someone holds a lock on (a fire still running on a connection
// we lost sight of) is undecided: looked at again next cycle. A segment is committed when
// none of its timers is left, the log has it at an offset, and it had hashes to look for.
// A seen shorter than the parked segments leaves the fires it does not cover undecided.
InDoubtPlan plan_in_doubt(const std::vector<ParkedFire> &parked, const std::vector<InDoubtSeen> &seen);

// ---- The link state ------------------------------------------------------------------------

// Where the recovery stands with the server.
enum class Link {
    unidentified,  // the server is to be identified, no loss awaits a fire (the start)
    connected,     // identified, nothing pending
    lost,          // a loss is dated; the server is to be identified again
    reconnected,   // identified again since the loss; no fire has committed since
};
enum class LinkEvent {
    call_lost,        // a call got no answer (the connection, its deadline, a read-only server)
    disconnect_seen,  // the pool counted a lost connection
    identified,       // the server answered who it is
    fired,            // fires committed (at least one timer)
};
struct LinkStep {
    Link next = Link::unidentified;
    bool new_loss = false;  // this event dates a loss (the first since the server was last found)
    bool again = false;     // identified: found again after a loss ("connected ... again")
    bool resumed = false;   // fired: the first fire since a loss (the resumption is dated)
};
// The transitions: call_lost goes to lost from anywhere (a new loss unless already lost);
// disconnect_seen is a call_lost when the server was ever identified (server_known), else
// it only asks for an identification; identified goes to connected, or to reconnected
// after a loss; fired ends the wait for a resumption (lost: identification still due).
LinkStep link_step(Link from, LinkEvent e, bool server_known = true);
// Whether the server is to be identified on the next cycle.
inline bool identify_due(Link l) { return l == Link::unidentified || l == Link::lost; }

}  // namespace qsw
