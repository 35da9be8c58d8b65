// The recovery after a lost connection: what a drain call left without an answer, kept
// until the server answers again and then resolved, so that nothing waits out a lease
// and the host hears of every fire that committed, once.
//
//   - a claim whose answer was lost: remembered by its id (the rows' token) and the window
//     its lease ends in, handed back by id (lost claims);
//   - a fire whose answer was lost (it may have committed): its segments checked against
//     the log, announced if they are there, handed back if their timers are still in the
//     table (in doubt);
//   - rows of a fail call whose answer was lost: handed back (parked, not in doubt).
// It also names the server the sweeper talks to, and dates the loss, the reconnection and
// the first fire after it (the stats' failover object).
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "base/task.hpp"
#include "codec/packer.hpp"
#include "pg/pg_conn.hpp"
#include "sweeper/claim_book.hpp"
#include "sweeper/context.hpp"
#include "sweeper/handback.hpp"
#include "sweeper/recovery_policy.hpp"

namespace qsw {

// Which server answers: its address as the server reports it and what it is (system
// identifier and timeline; empty where the role may not read them: kIdentifyServer).
struct ServerIdentity {
    std::string address;
    std::string identity;
};

// Whether `now` is another server than `before` (a failover): another address, or the same
// address with another identity (a floating IP, a VIP or a socket moved to a promoted
// standby or a restored copy). The first identification (no `before`) is no change, and
// an identity that one side could not read decides nothing.
bool is_new_server(const ServerIdentity &before, const ServerIdentity &now);

class Recovery {
public:
    Recovery(LoopContext &ctx, ClaimBook &book) : ctx_(ctx), book_(book) {}

    // At the start of every cycle: after any lost connection, identify the server again,
    // hand back lost claims, resolve parked fires.
    Task<void> run();

    // A drain call got no answer (the connection, its deadline, a read-only server).
    void note_lost(const char *phase, const PgResult &r);
    // The rows of a fire whose answer was lost (in_doubt: it was sent and may have
    // committed), or of a fail call (which cannot be in the log): kept, still ours.
    void park_fire(const ClaimRows &rows, const FireBatch &batch, bool in_doubt);
    void park_rows(const ClaimRows &rows, const std::vector<size_t> &which);
    // A claim sent at `sent_mono` with id `claim_id` whose answer was lost.
    // floor_ms: the floor the claim was sent with (its rows are at or after it, but listed
    // held rows), which bounds the hand-back's walk; none: from the index's head.
    void remember_lost_claim(const std::string &claim_id, uint64_t sent_mono, std::optional<int64_t> floor_ms);
    // The probe's server now() and when it was sent and answered (loop clock): the server's
    // clock against the loop's, to place a lost claim's lease end.
    void note_server_clock(int64_t server_now_unix_ms, uint64_t sent_mono, uint64_t got_mono);
    // Fires committed: the first after a loss dates the resumption.
    void note_fired(int64_t timers);
    // A segment announced through on_fired (its commit seen): remembered for a few seconds,
    // so that after a failover to an asynchronous standby the sweeper can tell the host
    // which announced fires the new primary does not have (lost with the old one).
    void remember_fired(const std::vector<ClaimedTimer> &rows, const PackedSegment &seg, int64_t base_offset);
    // At a graceful stop: whatever is parked is released with every other held claim.
    void forget_parked() { parked_.clear(); }
    bool has_parked() const { return !parked_.empty(); }
    // The recovery's own figures (stats "failover"), and its part of fired_total,
    // fired_segments_total and released_total; written by the recovery alone, on the loop
    // thread; Sweeper::publish_pool gathers them into the snapshot.
    struct Shares {
        int64_t fired = 0, fired_segments = 0, released = 0;
    };
    const FailoverFigures &figures() const { return fig_; }
    const Shares &shares() const { return shares_; }
    // How many times a different server answered after a loss (a failover).
    uint64_t server_changes() const { return server_changes_; }

private:
    uint64_t server_changes_ = 0;
    std::string identity_;  // the identity part of the server last identified
    // An announced segment: what the check of recent fires looks for in the new primary.
    struct Announced {
        std::string tenant, queue, partition, hashes;
        int64_t count = 0, base = -1;
        uint64_t at_mono = 0;
        std::vector<std::pair<std::string, std::string>> rows;  // (timer key, claim token): handed back if the fire was lost
        size_t bytes() const;
    };
    struct LostClaim {
        std::string id;
        int64_t lease_from_unix_ms = 0, lease_to_unix_ms = 0;
        std::optional<int64_t> floor_unix_ms;
        uint64_t forget_at_mono = 0;  // past its lease: its rows are anyone's again
    };

    // What the check decided: the committed segments are announced and gone from the
    // books; these rows go back; these fires (indexes into parked_) are done once they have.
    struct Settled {
        std::vector<RowRef> release;
        std::vector<size_t> decided;
    };

    Task<bool> identify_server();
    void notice_disconnects();
    void date_loss(const char *phase, const PgResult &r, bool first);
    Task<void> hand_back_lost_claims();
    Task<void> resolve_parked();
    Task<void> release_parked_unchecked();  // a role that may not read the tables
    Task<void> check_recent_fires();        // after a server change: announced fires it lacks
    Settled settle_checked(const std::vector<InDoubtSeen> &seen);
    void drop_decided(const std::vector<size_t> &decided, int64_t released);
    void add_parked(ParkedFire pf, int64_t rows);

    LoopContext &ctx_;
    FailoverFigures fig_;
    Shares shares_;
    ClaimBook &book_;
    std::vector<ParkedFire> parked_;
    std::vector<LostClaim> lost_claims_;
    std::deque<Announced> announced_;       // the last kAnnouncedWindowMs of announcements
    size_t announced_bytes_ = 0;
    std::vector<Announced> to_check_;       // announced before a server change, to look for
    static constexpr uint64_t kAnnouncedWindowMs = 10000;
    static constexpr size_t kAnnouncedMaxBytes = 8u << 20;
    int64_t server_now_unix_ms_ = 0;
    uint64_t server_now_sent_mono_ = 0, server_now_got_mono_ = 0;
    int64_t seen_disconnects_ = 0;
    Link link_ = Link::unidentified;      // where the recovery stands with the server (link_step)
    bool check_refused_logged_ = false;   // the in-doubt check lacks table privileges (said once)
};

}  // namespace qsw
