// libFuzzer target: the text a fire answers (sql::kFire), through qsw::parse_fire_answer, on
// a host-sized thread stack (see fuzz_util.hpp). The answer comes from the database: a
// function replaced by hand, a proxy that garbles, a server of another version. Every input
// is read or called unreadable with a reason, never thrown; what is read is within its
// bounds; and a compact answer that reads (the form the sweeper asks for) writes back to one
// that reads to the very same segments; the partitions' addresses it reads (schema 37) are
// one per segment or none, each a tid or empty.
//
// An input whose first byte is 0xC5 is not text but the recipe of a compact answer (letters,
// arrays a little too short or long, elements out of range or of another type, a key left
// out), built and then read against an oracle written here from the rule: it reads exactly
// when every letter is one of fbsd, every array is there with one element per letter of its
// kind, and every element is an integer from 0 to INT64_MAX; then to those very values.
// Mutating raw text almost never keeps the arrays and the letters in step; this does.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_util.hpp"
#include "pg/fire_answer.hpp"
#include "pg/sql_args.hpp"

namespace {

// The compact form of what was read: a letter per segment, an array per kind.
nlohmann::json compact_of(const qsw::FireAnswer &a) {
    std::string statuses;
    nlohmann::json bases = nlohmann::json::array(), held = nlohmann::json::array(),
                   dups = nlohmann::json::array(), rels = nlohmann::json::array();
    for (const qsw::FireSegmentAnswer &s : a.segments) {
        switch (s.status) {
            case qsw::FireSegStatus::fired: statuses += 'f'; bases.push_back(s.base_offset); break;
            case qsw::FireSegStatus::stale: statuses += 's'; held.push_back(s.held); break;
            case qsw::FireSegStatus::duplicate:
                statuses += 'd';
                dups.push_back(s.duplicates);
                rels.push_back(s.released);
                break;
            case qsw::FireSegStatus::busy: statuses += 'b'; break;
            case qsw::FireSegStatus::other: qsw_fuzz::broken("a compact answer read to a status of no letter");
        }
    }
    return {{"statuses", statuses}, {"baseOffsets", bases}, {"staleHeld", held},
            {"dupDuplicates", dups}, {"dupReleased", rels}, {"provisionBusy", a.provision_busy}};
}

bool same(const qsw::FireSegmentAnswer &x, const qsw::FireSegmentAnswer &y) {
    return x.status == y.status && x.base_offset == y.base_offset && x.held == y.held &&
           x.duplicates == y.duplicates && x.released == y.released;
}

// Bytes of the recipe, read in turn; zero past the end.
struct Bytes {
    const uint8_t *p;
    size_t n, i = 0;
    uint8_t next() { return i < n ? p[i++] : 0; }
    uint64_t next64() {
        uint64_t v = 0;
        for (int k = 0; k < 8; ++k) v = (v << 8) | next();
        return v;
    }
};

// One element of an array: valid (an integer 0..INT64_MAX) or not, and the JSON written.
nlohmann::json element(Bytes &b, bool &valid, int64_t &value) {
    const uint8_t kind = b.next() % 10;
    const uint64_t raw = b.next64();
    valid = false;
    switch (kind) {
        case 0: case 1: case 2: case 3: case 4:
            valid = true;
            value = static_cast<int64_t>(raw & static_cast<uint64_t>(INT64_MAX));
            if (kind == 0) value = 0;
            if (kind == 1) value = INT64_MAX;
            return value;
        case 5: return -static_cast<int64_t>((raw & 0xffffffff) + 1);          // below 0
        case 6: return raw | (uint64_t{1} << 63);                             // above INT64_MAX
        case 7: return static_cast<double>(raw & 0xffff) + 0.5;               // not an integer
        case 8: return std::to_string(raw & 0xffff);                          // a string
        default: return nullptr;
    }
}

void recipe(const uint8_t *data, size_t size) {
    Bytes b{data, size};
    const size_t nseg = b.next() % 12;
    std::string statuses;
    bool letters_ok = true;
    for (size_t i = 0; i < nseg; ++i) {
        const uint8_t c = b.next();
        const char letter = (c % 32 == 31) ? static_cast<char>(c / 2) : "fsdb"[c % 4];
        if (letter != 'f' && letter != 's' && letter != 'd' && letter != 'b') letters_ok = false;
        statuses += letter;
    }
    auto count = [&](char l) { return static_cast<size_t>(std::count(statuses.begin(), statuses.end(), l)); };
    // Each array: present or not, its length the letters' count or one off, its elements.
    struct Arr {
        const char *name;
        size_t want;
        bool present = true, ok = true;
        std::vector<int64_t> values;
        nlohmann::json j = nlohmann::json::array();
    };
    Arr arrs[4] = {{"baseOffsets", count('f')}, {"staleHeld", count('s')},
                   {"dupDuplicates", count('d')}, {"dupReleased", count('d')}};
    nlohmann::json answer = nlohmann::json::object();
    answer["statuses"] = statuses;
    for (Arr &a : arrs) {
        const uint8_t shape = b.next();
        size_t len = a.want;
        if (shape % 16 == 1) ++len;
        if (shape % 16 == 2 && len > 0) --len;
        if (shape % 16 == 3) {
            a.present = a.ok = false;
            continue;
        }
        if (len != a.want) a.ok = false;
        for (size_t k = 0; k < len; ++k) {
            bool valid = false;
            int64_t v = 0;
            a.j.push_back(element(b, valid, v));
            if (!valid) a.ok = false;
            a.values.push_back(v);
        }
        if (shape % 16 == 4) {
            a.j = nlohmann::json::object();  // present, not an array
            a.ok = false;
        }
        answer[a.name] = a.j;
    }
    bool pb_valid = false;
    int64_t pb = 0;
    const uint8_t pb_shape = b.next();
    if (pb_shape % 4 != 0) answer["provisionBusy"] = element(b, pb_valid, pb);

    const qsw::FireAnswer got = qsw::parse_fire_answer(answer.dump());
    bool want_readable = letters_ok;
    for (const Arr &a : arrs) want_readable = want_readable && a.present && a.ok;
    QSW_FUZZ_CHECK(got.readable == want_readable, answer.dump() + " -> " + (got.readable ? "read" : got.unreadable));
    if (!want_readable) {
        QSW_FUZZ_CHECK(got.segments.empty(), "an unreadable answer kept segments");
        return;
    }
    QSW_FUZZ_CHECK(got.provision_busy == (pb_valid ? pb : 0), answer.dump());
    QSW_FUZZ_CHECK(got.segments.size() == nseg, answer.dump());
    size_t next[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < nseg; ++i) {
        qsw::FireSegmentAnswer want;
        switch (statuses[i]) {
            case 'f': want.status = qsw::FireSegStatus::fired; want.base_offset = arrs[0].values[next[0]++]; break;
            case 's': want.status = qsw::FireSegStatus::stale; want.held = arrs[1].values[next[1]++]; break;
            case 'd':
                want.status = qsw::FireSegStatus::duplicate;
                want.duplicates = arrs[2].values[next[2]++];
                want.released = arrs[3].values[next[3]++];
                break;
            default: want.status = qsw::FireSegStatus::busy; break;
        }
        QSW_FUZZ_CHECK(same(got.segments[i], want), answer.dump() + ", segment " + std::to_string(i));
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 0 && data[0] == 0xC5) {
        qsw_fuzz::on_host_stack([&] { recipe(data + 1, size - 1); });
        return 0;
    }
    const std::string_view text(reinterpret_cast<const char *>(data), size);
    qsw_fuzz::on_host_stack([&] {
        const qsw::FireAnswer a = qsw::parse_fire_answer(text);
        QSW_FUZZ_CHECK(a.provision_busy >= 0, std::to_string(a.provision_busy));
        if (!a.readable) {
            QSW_FUZZ_CHECK(!a.unreadable.empty(), "unreadable without a reason");
            QSW_FUZZ_CHECK(a.segments.empty(), "an unreadable answer kept segments");
            return;
        }
        QSW_FUZZ_CHECK(a.unreadable.empty(), a.unreadable);
        // Past the answer's end every segment is busy: kept, never counted fired.
        QSW_FUZZ_CHECK(a.segment(a.segments.size()).status == qsw::FireSegStatus::busy, "past the end");
        // The partitions' addresses go back to the server as tid[] elements: none or one per
        // segment, each empty (unknown) or a tid, nothing else ever passed on.
        QSW_FUZZ_CHECK(a.partition_tids.empty() || a.partition_tids.size() == a.segments.size(),
                       "partition addresses not one per segment");
        for (const std::string &t : a.partition_tids)
            QSW_FUZZ_CHECK(t.empty() || qsw::is_tid_text(t), "a partition address that is not a tid: " + t);
        const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
        QSW_FUZZ_CHECK(j.is_object(), "read an answer that is not a JSON object");
        const auto st = j.find("statuses");
        if (st == j.end()) {
            const auto segs = j.find("segments");
            QSW_FUZZ_CHECK(segs != j.end() && segs->is_array() && segs->size() == a.segments.size(),
                           "the full form read to another number of segments");
            return;
        }
        QSW_FUZZ_CHECK(st->is_string() && st->get<std::string>().size() == a.segments.size(),
                       "the compact form read to another number of segments than its letters");
        for (const qsw::FireSegmentAnswer &s : a.segments) {
            QSW_FUZZ_CHECK(s.status != qsw::FireSegStatus::fired || s.base_offset >= 0, "a fired offset below 0");
            QSW_FUZZ_CHECK(s.held >= 0 && s.duplicates >= 0 && s.released >= 0, "a count below 0");
        }
        const qsw::FireAnswer b = qsw::parse_fire_answer(compact_of(a).dump());
        QSW_FUZZ_CHECK(b.readable, b.unreadable);
        QSW_FUZZ_CHECK(b.segments.size() == a.segments.size() && b.provision_busy == a.provision_busy,
                       "written back, another number of segments");
        for (size_t i = 0; i < a.segments.size(); ++i)
            QSW_FUZZ_CHECK(same(a.segments[i], b.segments[i]), "written back, segment " + std::to_string(i));
    });
    return 0;
}
