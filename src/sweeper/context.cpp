#include "sweeper/context.hpp"

#include "base/reentry.hpp"

namespace qsw {

void LoopContext::announce(const std::string &tenant, const std::string &queue, const std::string &partition,
                           uint32_t count, int64_t base_offset) const {
    if (!fired_fn) return;
    try {
        CallbackScope in_callback;
        fired_fn(fired_user, tenant.c_str(), queue.c_str(), partition.c_str(), count, base_offset);
    } catch (...) {
        log.error("the host's on_fired callback threw; ignored");
    }
}

}  // namespace qsw
