// Warnings about environment variables that look like the sweeper's but are not
// one of its knobs: a misspelt QUEEN_* variable must not pass silently.
#pragma once
#include <string>
#include <vector>

namespace qsw {

// The rule (pure, so both sides of it are asserted in a unit test):
//   - QUEEN_SWEEPER and QUEEN_SWEEPER_* are the plugin's own prefix: every such name that
//     is not a knob's variable is reported, except the few the bindings and the build read
//     (QUEEN_SWEEPER_LIBRARY, QUEEN_SWEEPER_LIB_DIR, QUEEN_SWEEPER_BUILD_DIR).
//   - any other QUEEN_* name is the host broker's business and stays silent, unless it is
//     within two edits of a knob's variable (QUEEN_KV_EXPIRE_BATCHH, QUEEN_STMT_TIMEOUT):
//     a typo of ours. QUEEN_EPHEMERAL_* and QUEEN_TEST_* belong to the ephemeral engine
//     and the tests and are never reported.
// knob_keys are the JSON keys (lower case); their variables are QUEEN_ + upper case.
std::vector<std::string> unknown_env_warnings(const std::vector<std::string> &env_names,
                                              const std::vector<std::string> &knob_keys);

// The names of the process environment, for the rule above.
std::vector<std::string> environment_names();

}  // namespace qsw
