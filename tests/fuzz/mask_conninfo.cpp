// libFuzzer target: qsw::mask_conninfo, which every log line, stats document and error
// that mentions the conninfo goes through. Two properties on a host-sized thread stack:
// any input is masked without crashing, and a password planted in the keyword form and in
// the URI form around fuzzed text never survives the masking.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "fuzz_util.hpp"

namespace {

// A password made from the input, in characters that need no quoting in either form, and
// marked so that it cannot collide with the fixed text around it.
std::string planted_password(const uint8_t *data, size_t size) {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    std::string p = "Pw9";
    for (size_t i = 0; i < size && p.size() < 64; ++i) p += alphabet[data[i] % 36];
    return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string raw(reinterpret_cast<const char *>(data), size);
    const std::string secret = planted_password(data, size);
    qsw_fuzz::on_host_stack([&] {
        (void)qsw::mask_conninfo(raw);

        const std::string kw = "host=db.example port=5432 password=" + secret + " dbname=queen";
        const std::string kw_masked = qsw::mask_conninfo(kw);
        QSW_FUZZ_CHECK(kw_masked.find(secret) == std::string::npos, kw_masked);

        const std::string uri = "postgresql://queen:" + secret + "@db.example:5432/queen";
        const std::string uri_masked = qsw::mask_conninfo(uri);
        QSW_FUZZ_CHECK(uri_masked.find(secret) == std::string::npos, uri_masked);
    });
    return 0;
}
