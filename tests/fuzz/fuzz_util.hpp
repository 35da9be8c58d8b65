// Shared by the libFuzzer targets: running one input on a thread with a small stack, and a
// check that aborts (so libFuzzer records the input) with a message saying what broke.
#pragma once
#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace qsw_fuzz {

// Hosts call the ABI from their own threads, and a 512 KiB stack is a common size for
// those (some runtimes give less). Any recursion over input shows up here as a crash,
// where the fuzzer's 8 MiB main thread would hide it. QUEEN_FUZZ_STACK_KB overrides.
inline size_t host_stack_bytes() {
    static const size_t bytes = [] {
        const char *v = std::getenv("QUEEN_FUZZ_STACK_KB");
        const long kb = v ? std::strtol(v, nullptr, 10) : 512;
        return static_cast<size_t>(kb > 64 ? kb : 64) * 1024;
    }();
    return bytes;
}

template <class F> void on_host_stack(F &&fn) {
    struct Box {
        F *fn;
        static void *run(void *p) {
            (*static_cast<Box *>(p)->fn)();
            return nullptr;
        }
    } box{&fn};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, host_stack_bytes());
    pthread_t t;
    if (pthread_create(&t, &attr, &Box::run, &box) != 0) {
        // No thread (resource limits): still test the input rather than drop it.
        fn();
    } else {
        pthread_join(t, nullptr);
    }
    pthread_attr_destroy(&attr);
}

[[noreturn]] inline void broken(const char *what, const std::string &detail = {}) {
    std::fprintf(stderr, "fuzz property broken: %s%s%s\n", what, detail.empty() ? "" : ": ",
                 detail.c_str());
    std::abort();
}

#define QSW_FUZZ_CHECK(cond, detail)                      \
    do {                                                  \
        if (!(cond)) ::qsw_fuzz::broken(#cond, (detail)); \
    } while (0)

}  // namespace qsw_fuzz
