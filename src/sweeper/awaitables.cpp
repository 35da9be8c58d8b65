#include "sweeper/awaitables.hpp"

#include <functional>
#include <memory>

namespace qsw {

CallbackAwaiter<int> loop_delay(uv_loop_t *loop, int64_t ms) {
    return CallbackAwaiter<int>{[loop, ms](std::function<void(int)> done) {
                                    auto *t = new uv_timer_t;
                                    uv_timer_init(loop, t);
                                    t->data = new std::function<void(int)>(std::move(done));
                                    uv_timer_start(t, [](uv_timer_t *h) {
                                        auto *fn = static_cast<std::function<void(int)> *>(h->data);
                                        uv_close(reinterpret_cast<uv_handle_t *>(h), [](uv_handle_t *c) {
                                            delete reinterpret_cast<uv_timer_t *>(c);
                                        });
                                        auto f = std::move(*fn);
                                        delete fn;
                                        f(0);
                                    }, static_cast<uint64_t>(ms > 0 ? ms : 0), 0);
                                },
                                {}, {}, false};
}

CallbackAwaiter<std::exception_ptr> join_all(std::vector<Task<void>> tasks) {
    auto shared = std::make_shared<std::vector<Task<void>>>(std::move(tasks));
    return CallbackAwaiter<std::exception_ptr>{
        [shared](std::function<void(std::exception_ptr)> done) {
            struct Join {
                size_t left;
                std::exception_ptr first;
            };
            auto join = std::make_shared<Join>(Join{shared->size(), nullptr});
            if (join->left == 0) {
                done(nullptr);
                return;
            }
            for (auto &t : *shared) {
                spawn(std::move(t), [join, done](std::exception_ptr e) {
                    if (e && !join->first) join->first = e;
                    if (--join->left == 0) done(join->first);
                });
            }
        },
        {}, {}, false};
}

Task<void> run_all(std::vector<Task<void>> tasks) {
    std::exception_ptr e = co_await join_all(std::move(tasks));
    if (e) std::rethrow_exception(e);
}

}  // namespace qsw
