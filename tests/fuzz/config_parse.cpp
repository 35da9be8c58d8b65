// libFuzzer target: the configuration JSON a host hands to queen_sweeper_create, through
// qsw::parse_config, on a host-sized thread stack (see fuzz_util.hpp). Every input either
// parses or is refused with a message; an accepted configuration must serialise again
// (to_json feeds stats and logs) without throwing, with the password masked.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "fuzz_util.hpp"

extern char **environ;

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    // The parser also reads QUEEN_* variables; whatever the CI shell exports must not make
    // one input behave differently from one run to the next.
    std::vector<std::string> names;
    for (char **e = environ; *e; ++e)
        if (std::strncmp(*e, "QUEEN_", 6) == 0) names.emplace_back(*e, std::strcspn(*e, "="));
    for (const auto &n : names)
        if (n != "QUEEN_FUZZ_STACK_KB") unsetenv(n.c_str());
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    qsw_fuzz::on_host_stack([&] {
        qsw::Config cfg;
        std::string error;
        const bool ok = qsw::parse_config(text.c_str(), cfg, error);
        if (!ok) {
            QSW_FUZZ_CHECK(!error.empty(), "refused without a message");
            return;
        }
        std::string dumped;
        try {
            dumped = cfg.to_json().dump();
        } catch (const std::exception &e) {
            qsw_fuzz::broken("accepted configuration cannot be serialised", e.what());
        }
        QSW_FUZZ_CHECK(!dumped.empty(), "empty serialisation");
    });
    return 0;
}
