// The fire's answer (see fire_answer.hpp).
#include "pg/fire_answer.hpp"

#include <algorithm>
#include <string>

#include "base/json_get.hpp"
#include "pg/sql_args.hpp"

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

// The compact form (schema 34): "statuses", a letter per segment, and an array per kind with
// an element per segment of that kind, in order. Any array shorter or longer than its
// letters, an element that is not an integer from 0 to INT64_MAX, or a letter not of the
// four is unreadable: the server writes this form for the sweeper alone, so anything off
// in it is not read by default values (as the full form's keys are) but resolved from the
// log like a fire whose answer was lost.
void read_partition_tids(const nlohmann::json &j, FireAnswer &a);

FireAnswer read_compact_fire_answer(const nlohmann::json &j, const std::string &statuses) {
    struct Kind {
        const char *name;
        const nlohmann::json *items = nullptr;
        size_t next = 0;
    };
    Kind bases{"baseOffsets"}, held{"staleHeld"}, dups{"dupDuplicates"}, rels{"dupReleased"};
    for (Kind *k : {&bases, &held, &dups, &rels}) {
        const auto it = j.find(k->name);
        if (it == j.end() || !it->is_array()) return unreadable_fire(std::string("no ") + k->name + " array");
        k->items = &*it;
    }
    auto take = [](Kind &k, int64_t &out) {
        if (k.next >= k.items->size()) return false;
        const nlohmann::json &v = (*k.items)[k.next++];
        // An offset or a count: an integer from 0 to INT64_MAX, nothing else.
        if (v.is_number_unsigned()) {
            if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
        } else if (!v.is_number_integer() || v.get<int64_t>() < 0) {
            return false;
        }
        out = v.get<int64_t>();
        return true;
    };
    FireAnswer a;
    a.segments.reserve(statuses.size());
    for (const char c : statuses) {
        FireSegmentAnswer s;
        bool ok = true;
        switch (c) {
            case 'f': s.status = FireSegStatus::fired; ok = take(bases, s.base_offset); break;
            case 's': s.status = FireSegStatus::stale; ok = take(held, s.held); break;
            case 'd':
                s.status = FireSegStatus::duplicate;
                ok = take(dups, s.duplicates) && take(rels, s.released);
                break;
            case 'b': s.status = FireSegStatus::busy; break;
            default: return unreadable_fire(std::string("a segment status letter '") + c + "'");
        }
        if (!ok) return unreadable_fire("an array of the compact answer that does not match its statuses");
        a.segments.push_back(s);
    }
    for (const Kind *k : {&bases, &held, &dups, &rels})
        if (k->next != k->items->size()) return unreadable_fire(std::string(k->name) + " longer than its statuses");
    a.provision_busy = std::max<int64_t>(json_get<int64_t>(j, "provisionBusy", 0), 0);
    read_partition_tids(j, a);
    a.readable = true;
    return a;
}

// "partitionTids", when it is an array with an element per segment, each null or a tid.
void read_partition_tids(const nlohmann::json &j, FireAnswer &a) {
    const auto it = j.find("partitionTids");
    if (it == j.end() || !it->is_array() || it->size() != a.segments.size()) return;
    std::vector<std::string> tids;
    tids.reserve(it->size());
    for (const nlohmann::json &v : *it) {
        if (v.is_null()) {
            tids.emplace_back();
            continue;
        }
        if (!v.is_string() || !is_tid_text(v.get_ref<const std::string &>())) return;
        tids.push_back(v.get<std::string>());
    }
    a.partition_tids = std::move(tids);
}

}  // namespace

FireAnswer read_fire_answer(const nlohmann::json &j) {
    if (!j.is_object()) return unreadable_fire("not an object");
    const auto compact = j.find("statuses");
    if (compact != j.end()) {
        if (!compact->is_string()) return unreadable_fire("statuses that is not a string");
        return read_compact_fire_answer(j, compact->get<std::string>());
    }
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
    read_partition_tids(j, a);
    a.readable = true;
    return a;
}

FireAnswer parse_fire_answer(std::string_view text) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) return unreadable_fire("not JSON");
    return read_fire_answer(j);
}

}  // namespace qsw
