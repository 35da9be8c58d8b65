// Awaitables over the sweeper's loop: a plain pause, and several tasks run side by side.
#pragma once
#include <uv.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "base/task.hpp"

namespace qsw {

// A plain pause on the loop (not the cycle's sleep: no wake cuts it short).
CallbackAwaiter<int> loop_delay(uv_loop_t *loop, int64_t ms);

// Runs the tasks side by side and resumes when all are done. A task that throws does not
// cut the others short; the first exception is rethrown once all are done (by the
// awaiting coroutine), so an error is never swallowed here.
CallbackAwaiter<std::exception_ptr> join_all(std::vector<Task<void>> tasks);
Task<void> run_all(std::vector<Task<void>> tasks);

}  // namespace qsw
