// Typed calls (see calls.hpp).
#include "pg/calls.hpp"

#include <algorithm>

#include "base/json_get.hpp"

namespace qsw {

namespace {

FireAnswer unreadable_fire(std::string why) {
    FireAnswer a;
    a.unreadable = std::move(why);
    return a;
}

FireSegStatus fire_status(const std::string &s) {
    if (s == "busy" || s.empty()) return FireSegStatus::busy;
    if (s == "fired") return FireSegStatus::fired;
    if (s == "stale") return FireSegStatus::stale;
    if (s == "duplicate") return FireSegStatus::duplicate;
    return FireSegStatus::other;
}

}  // namespace

FireAnswer read_fire_answer(const nlohmann::json &j) {
    if (!j.is_object()) return unreadable_fire("not an object");
    const auto segs = j.find("segments");
    if (segs == j.end() || !segs->is_array()) return unreadable_fire("no segments array");
    FireAnswer a;
    a.segments.reserve(segs->size());
    for (const nlohmann::json &sj : *segs) {
        if (!sj.is_object()) return unreadable_fire("a segment that is not an object");
        const auto st = sj.find("status");
        if (st != sj.end() && !st->is_string() && !st->is_null())
            return unreadable_fire("a segment status that is not a string");
        FireSegmentAnswer s;
        s.status = fire_status(json_get(sj, "status", ""));
        s.base_offset = json_get<int64_t>(sj, "baseOffset", -1);
        s.held = json_get<int64_t>(sj, "held", 0);
        s.duplicates = json_get<int64_t>(sj, "duplicates", 0);
        s.released = json_get<int64_t>(sj, "released", 0);
        a.segments.push_back(s);
    }
    a.provision_busy = std::max<int64_t>(json_get<int64_t>(j, "provisionBusy", 0), 0);
    a.readable = true;
    return a;
}

FireAnswer parse_fire_answer(std::string_view text) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return unreadable_fire("not JSON");
    return read_fire_answer(j);
}

}  // namespace qsw
