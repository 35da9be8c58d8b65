// Re-entrancy: which threads are inside one of the host's callbacks right now. A host
// callback (on_log, on_fired, the backstop's sweep and attach_waker) may run on the loop
// thread or on the host thread inside start(), while locks the lifecycle calls need are
// held or the loop they would wait for is the very thread calling. So the lifecycle calls
// refuse at once from inside any callback (QUEEN_SWEEPER_ESTATE, documented in the header)
// instead of deadlocking or blocking for their whole timeout.
#pragma once

namespace qsw {

inline thread_local int tl_callback_depth = 0;

inline bool in_host_callback() { return tl_callback_depth > 0; }

struct CallbackScope {
    CallbackScope() { ++tl_callback_depth; }
    ~CallbackScope() { --tl_callback_depth; }
    CallbackScope(const CallbackScope &) = delete;
    CallbackScope &operator=(const CallbackScope &) = delete;
};

}  // namespace qsw
