// The KV prune: the last of the cycle's sub-clocks and the first phase shed under
// pressure. It deletes expired queen.kv rows on its own gate (kv_expire_every_ms) with its
// own row budget (kv_expire_batch), and on every pass, even one that deletes nothing,
// publishes how many expired rows are still present: an unpruned table looks healthy from
// the outside, so this count is its alarm.
#pragma once
#include <cstdint>
#include <vector>

#include "base/task.hpp"
#include "sweeper/context.hpp"

namespace qsw {

class Prune {
public:
    explicit Prune(const LoopContext &ctx) : ctx_(ctx) {}

    // One pass if the ladder allows it and the gate (read at `now_mono`) is open.
    // Returns whether the table holds work for the prune (expired keys remain, or keys
    // with a ttl still ahead): the cycle then keeps the prune's cadence instead of
    // letting the idle backoff grow.
    Task<bool> run(const std::vector<int16_t> &shards, bool allowed, uint64_t now_mono);
    // The stage shown in stats ("on" or "shed"); "off_config" stays once it is off.
    void show_stage(bool allowed);
    // Its figures, written here alone on the loop thread; the sweeper's publish gathers them.
    const PruneFigures &figures() const { return fig_; }
    // Until the gate opens again; INT64_MAX once the phase is off for good.
    int64_t ms_until_gate() const;

private:
    Task<bool> pass(const std::vector<int16_t> &shards, bool &kv_work);

    const LoopContext &ctx_;
    bool off_ = false;  // class 42: off for the life of the process
    uint64_t next_mono_ = 0;
    bool work_ahead_ = false;
    PruneFigures fig_;  // the last answered pass saw expired keys, or keys with a ttl
};

}  // namespace qsw
