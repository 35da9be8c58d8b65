#include "config/env_check.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include "base/last_error.hpp"

extern char **environ;

namespace qsw {
namespace {

std::string upper(const std::string &s) {
    std::string o = s;
    for (auto &c : o) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return o;
}

bool starts_with(const std::string &s, const char *p) { return s.rfind(p, 0) == 0; }

// Levenshtein distance, stopping early: only "two edits or fewer" matters.
size_t edit_distance(const std::string &a, const std::string &b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

}  // namespace

std::vector<std::string> unknown_env_warnings(const std::vector<std::string> &env_names,
                                              const std::vector<std::string> &knob_keys) {
    std::vector<std::string> vars;
    for (const auto &k : knob_keys) vars.push_back("QUEEN_" + upper(k));
    static const char *const kHostSide[] = {"QUEEN_SWEEPER_LIBRARY", "QUEEN_SWEEPER_LIB_DIR",
                                            "QUEEN_SWEEPER_BUILD_DIR"};
    std::vector<std::string> out;
    std::vector<std::string> names = env_names;
    std::sort(names.begin(), names.end());  // a stable order for the messages
    for (const auto &n : names) {
        if (!starts_with(n, "QUEEN_")) continue;
        if (std::find(vars.begin(), vars.end(), n) != vars.end()) continue;
        if (starts_with(n, "QUEEN_EPHEMERAL_") || starts_with(n, "QUEEN_TEST_")) continue;
        if (std::any_of(std::begin(kHostSide), std::end(kHostSide), [&](const char *h) { return n == h; })) continue;
        std::string nearest;
        size_t best = SIZE_MAX;
        for (const auto &v : vars) {
            const size_t d = edit_distance(n, v);
            if (d < best) best = d, nearest = v;
        }
        const bool ours = n == "QUEEN_SWEEPER" || starts_with(n, "QUEEN_SWEEPER_");
        if (!ours && best > 2) continue;
        // The name comes from the environment as it is: escaped, so a name that is not UTF-8
        // can never make the stats (JSON) unrenderable.
        std::string msg = "environment variable " + printable(n) + " is not a sweeper setting and is ignored";
        if (best <= 3) msg += "; did you mean " + nearest + "?";
        out.push_back(msg);
    }
    return out;
}

std::vector<std::string> environment_names() {
    std::vector<std::string> out;
    for (char **e = environ; e && *e; ++e) {
        const char *eq = std::strchr(*e, '=');
        out.emplace_back(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
    }
    return out;
}

}  // namespace qsw
