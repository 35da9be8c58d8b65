// A. PROBE: one read-only call and one server now(). From the floor (sweeper/floor.hpp),
// the first entry of the due index (due_at; the rows in flight passed by their lease,
// schema version 9) gives the nearest due instant within the horizon; a capped count
// gives the due rows (capped: a backlog, for the claims to name tenants from the ring); and
// the floor the next probe and claim start from.
#include "pg/sql_args.hpp"
#include "pg/statements.hpp"
#include "sweeper/sweeper.hpp"

namespace qsw {

Task<Sweeper::ProbeResult> Sweeper::probe(const std::vector<int16_t> &shards) {
    const FloorTicket floor = floor_->ticket();
    const std::optional<int64_t> horizon = floor_->horizon_ms(cycle_.idle_cycles);
    Query q;
    q.sql = sql::kProbe;
    q.params = {text_param(shards_param(shards)), text_param(std::to_string(cfg_.sweeper_due_cap)),
                floor.floor_ms ? text_param(std::to_string(*floor.floor_ms)) : null_param(),
                horizon ? text_param(std::to_string(*horizon)) : null_param()};
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
    try {
        auto j = nlohmann::json::parse(r.get(0, 0));
        p.ok = true;
        const bool no_next = !j.contains("nextInMs") || j["nextInMs"].is_null();
        // Nothing within the horizon is not an empty table: the next sleep is the ceiling.
        const bool beyond = no_next && j.value("beyond", false);
        floor_->note_beyond(beyond);
        p.empty = no_next && !beyond;
        p.next_in_ms = no_next ? (beyond ? horizon.value_or(cfg_.sweeper_max_sleep_ms) : 0) : j["nextInMs"].get<int64_t>();
        p.due = j.value("due", int64_t(0));
        p.held = j.value("held", int64_t(0));
        std::optional<int64_t> server_now;
        if (j.contains("nowMs") && j["nowMs"].is_number_integer()) {
            server_now = j["nowMs"].get<int64_t>();
            recovery_->note_server_clock(*server_now, sent, got);
        }
        std::optional<int64_t> next_floor;
        if (j.contains("floorMs") && j["floorMs"].is_number_integer()) next_floor = j["floorMs"].get<int64_t>();
        floor_->note_answer(floor, next_floor, server_now);
        floor_->note_probe_backlog(j.value("dueCapped", false));
        const bool fire_enabled = j.value("fireEnabled", true);
        const bool maintenance = j.value("maintenance", false);
        p.fire_enabled = fire_enabled;
        if (!fire_enabled && !cycle_.fire_paused_logged) {
            log_.warn(std::string("fire paused by ") + (maintenance ? "maintenance mode" : "timers_fire_enabled = false") +
                      ": timers are kept and drain oldest first on resume");
            cycle_.fire_paused_logged = true;
        } else if (fire_enabled && cycle_.fire_paused_logged) {
            log_.info("fire resumed");
            cycle_.fire_paused_logged = false;
        }
        std::lock_guard<std::mutex> g(stats_.mu);
        auto &f = stats_.f;
        f.timers_due = p.due;
        f.floor.held_rows = p.held;
        if (j.contains("turnTimeouts") && j["turnTimeouts"].is_number_integer())
            f.claim_turn_timeouts_fleet_total = std::max<int64_t>(j["turnTimeouts"].get<int64_t>(), 0);
        f.timers_due_capped = j.value("dueCapped", false);
        f.timers_oldest_late_ms = j.value("lateMs", int64_t(0));
        f.next_in_ms = p.empty ? -1 : std::max<int64_t>(p.next_in_ms, 0);
        f.fire_enabled = fire_enabled;
        f.maintenance = maintenance;
    } catch (const std::exception &e) {
        PgResult bad;
        bad.message = std::string("probe answer unreadable: ") + e.what();
        bad.sqlstate = "XX000";
        cycle_failed("probe", bad);
        p.ok = false;
    }
    co_return p;
}

}  // namespace qsw
