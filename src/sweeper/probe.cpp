// A. PROBE: one read-only call and one server now(). From the floor (sweeper/floor.hpp),
// the first entry of the due index (due_at; the rows in flight passed by their lease,
// schema version 9) gives the nearest due instant within the horizon; a capped count
// gives the due rows (capped: a backlog, for the claims to name tenants from the ring); and
// the floor the next probe and claim start from.
#include "pg/calls.hpp"
#include "sweeper/sweeper.hpp"

namespace qsw {

Task<Sweeper::ProbeResult> Sweeper::probe(const std::vector<int16_t> &shards) {
    const FloorTicket floor = floor_->ticket();
    const std::optional<int64_t> horizon = floor_->horizon_ms(cycle_.idle_cycles);
    Query q = probe_query(ProbeArgs{shards, cfg_.sweeper_due_cap, floor.floor_ms, horizon});
    q.timeout_ms = cfg_.stmt_timeout_ms;
    const uint64_t sent = uv_now(&loop_);
    PgResult r = co_await pool_->query(Lane::maint, std::move(q));
    const uint64_t got = uv_now(&loop_);
    ProbeResult p;
    {
        std::lock_guard<std::mutex> g(stats_.mu);
        ++stats_.f.probes_total;
        if (r.elapsed_us > 0) stats_.f.probe_calls.observe(r.elapsed_us);  // 0: never sent
    }
    if (!r.ok || r.rows() != 1) {
        if (r.ok) r.message = "probe returned no row";
        cycle_failed("probe", r);
        co_return p;
    }
    const ProbeAnswer a = read_probe_answer(r.get(0, 0));
    if (!a.readable) {
        PgResult bad;
        bad.message = "probe answer unreadable: " + a.unreadable;
        bad.sqlstate = "XX000";
        cycle_failed("probe", bad);
        co_return p;
    }
    p.ok = true;
    const bool no_next = !a.next_in_ms;
    // Nothing within the horizon is not an empty table: the next sleep is the ceiling.
    const bool beyond = no_next && a.beyond;
    floor_->note_beyond(beyond);
    p.empty = no_next && !beyond;
    p.next_in_ms = no_next ? (beyond ? horizon.value_or(cfg_.sweeper_max_sleep_ms) : 0) : *a.next_in_ms;
    p.due = a.due;
    p.held = a.held;
    if (a.now_ms) recovery_->note_server_clock(*a.now_ms, sent, got);
    floor_->note_answer(floor, a.floor_ms, a.now_ms);
    floor_->note_probe_backlog(a.due_capped);
    floor_->note_held_rows(p.held);
    p.fire_enabled = a.fire_enabled;
    if (!a.fire_enabled && !cycle_.fire_paused_logged) {
        log_.warn(std::string("fire paused by ") + (a.maintenance ? "maintenance mode" : "timers_fire_enabled = false") +
                  ": timers are kept and drain oldest first on resume");
        cycle_.fire_paused_logged = true;
    } else if (a.fire_enabled && cycle_.fire_paused_logged) {
        log_.info("fire resumed");
        cycle_.fire_paused_logged = false;
    }
    std::lock_guard<std::mutex> g(stats_.mu);
    auto &f = stats_.f;
    f.timers_due = p.due;
    if (a.turn_timeouts) f.claim_turn_timeouts_fleet_total = *a.turn_timeouts;
    f.timers_due_capped = a.due_capped;
    f.timers_oldest_late_ms = a.late_ms;
    f.next_in_ms = p.empty ? -1 : std::max<int64_t>(p.next_in_ms, 0);
    f.fire_enabled = a.fire_enabled;
    f.maintenance = a.maintenance;
    co_return p;
}

}  // namespace qsw
