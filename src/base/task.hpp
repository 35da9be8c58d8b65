// A minimal C++20 coroutine task for a single-threaded libuv loop, so the cycle
// reads top to bottom like the design document instead of as a callback pyramid.
// Tasks are lazy: they start when awaited (or when spawned) and resume their
// awaiter on completion by symmetric transfer.
#pragma once
#include <coroutine>
#include <exception>
#include <functional>
#include <new>
#include <string>
#include <optional>
#include <utility>

namespace qsw {

template <class T> class Task;

namespace detail {
struct FinalAwaiter {
    bool await_ready() noexcept { return false; }
    template <class P> std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
        auto c = h.promise().continuation;
        return c ? c : std::noop_coroutine();
    }
    void await_resume() noexcept {}
};
struct PromiseBase {
    std::coroutine_handle<> continuation;
    std::exception_ptr error;
    std::suspend_always initial_suspend() noexcept { return {}; }
    FinalAwaiter final_suspend() noexcept { return {}; }
    void unhandled_exception() noexcept { error = std::current_exception(); }
};
}  // namespace detail

template <class T> class [[nodiscard]] Task {
public:
    struct promise_type : detail::PromiseBase {
        std::optional<T> value;
        Task get_return_object() { return Task{std::coroutine_handle<promise_type>::from_promise(*this)}; }
        template <class U> void return_value(U &&v) { value.emplace(std::forward<U>(v)); }
    };
    Task(Task &&o) noexcept : h_(std::exchange(o.h_, {})) {}
    Task &operator=(Task &&o) noexcept {
        if (this != &o) {
            if (h_) h_.destroy();
            h_ = std::exchange(o.h_, {});
        }
        return *this;
    }
    ~Task() {
        if (h_) h_.destroy();
    }
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> c) noexcept {
        h_.promise().continuation = c;
        return h_;
    }
    T await_resume() {
        if (h_.promise().error) std::rethrow_exception(h_.promise().error);
        return std::move(*h_.promise().value);
    }
    // After completion: what it threw, or its value (settle() below reads them).
    std::exception_ptr error() const { return h_.promise().error; }
    T take() { return std::move(*h_.promise().value); }

private:
    explicit Task(std::coroutine_handle<promise_type> h) : h_(h) {}
    std::coroutine_handle<promise_type> h_;
};

template <> class [[nodiscard]] Task<void> {
public:
    struct promise_type : detail::PromiseBase {
        Task get_return_object() { return Task{std::coroutine_handle<promise_type>::from_promise(*this)}; }
        void return_void() noexcept {}
    };
    Task(Task &&o) noexcept : h_(std::exchange(o.h_, {})) {}
    Task &operator=(Task &&o) noexcept {
        if (this != &o) {
            if (h_) h_.destroy();
            h_ = std::exchange(o.h_, {});
        }
        return *this;
    }
    ~Task() {
        if (h_) h_.destroy();
    }
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> c) noexcept {
        h_.promise().continuation = c;
        return h_;
    }
    void await_resume() {
        if (h_.promise().error) std::rethrow_exception(h_.promise().error);
    }
    std::exception_ptr error() const { return h_.promise().error; }

private:
    explicit Task(std::coroutine_handle<promise_type> h) : h_(h) {}
    std::coroutine_handle<promise_type> h_;
};

// Awaits a task and hands back what it threw as a value instead of rethrowing it, so a
// phase contains its own failures as results: `co_await settle(t)` -> Settled<T>.
// (Never write `a && co_await f()`: gcc 12 destroys the awaited frame of a co_await in a
// short-circuit operand without running it; await into a variable first.)
template <class T> struct Settled {
    std::optional<T> value;
    std::exception_ptr error;
};
template <class T> struct SettleAwaiter {
    Task<T> task;
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> c) noexcept { return task.await_suspend(c); }
    Settled<T> await_resume() {
        Settled<T> s;
        s.error = task.error();
        if (!s.error) s.value.emplace(task.take());
        return s;
    }
};
template <class T> SettleAwaiter<T> settle(Task<T> t) { return SettleAwaiter<T>{std::move(t)}; }
struct SettleVoidAwaiter {
    Task<void> task;
    bool await_ready() const noexcept { return false; }
    std::coroutine_handle<> await_suspend(std::coroutine_handle<> c) noexcept { return task.await_suspend(c); }
    std::exception_ptr await_resume() { return task.error(); }
};
inline SettleVoidAwaiter settle(Task<void> t) { return SettleVoidAwaiter{std::move(t)}; }

// What an exception says, for a log line and last_error (never throws).
inline std::string describe(std::exception_ptr e) {
    if (!e) return "no error";
    try {
        std::rethrow_exception(e);
    } catch (const std::bad_alloc &) {
        return "out of memory";
    } catch (const std::exception &x) {
        return x.what();
    } catch (...) {
        return "unknown internal error";
    }
}

// Runs a task to completion without an awaiter and calls `done` afterwards
// (with the exception, if it threw). The coroutine frame frees itself.
struct Detached {
    struct promise_type {
        Detached get_return_object() noexcept { return {}; }
        std::suspend_never initial_suspend() noexcept { return {}; }
        std::suspend_never final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
};

inline Detached spawn(Task<void> t, std::function<void(std::exception_ptr)> done) {
    std::exception_ptr err;
    try {
        co_await t;
    } catch (...) {
        err = std::current_exception();
    }
    if (done) done(err);
}

// Callback-to-coroutine bridge: `start(complete)` begins an operation that later
// calls complete(value) exactly once, possibly synchronously.
template <class T> struct CallbackAwaiter {
    std::function<void(std::function<void(T)>)> start;
    std::optional<T> value;
    std::coroutine_handle<> handle;
    bool suspended = false;

    bool await_ready() const noexcept { return false; }
    bool await_suspend(std::coroutine_handle<> h) {
        handle = h;
        start([this](T v) {
            value.emplace(std::move(v));
            if (suspended) handle.resume();
        });
        if (value) return false;  // completed synchronously: do not suspend
        suspended = true;
        return true;
    }
    T await_resume() { return std::move(*value); }
};

}  // namespace qsw
