// libFuzzer target: the ephemeral engine through its C ABI (queen_ephemeral.h), driven by
// the input as a program: the first bytes choose the configuration, every following byte
// an operation (push, pop, ack, sweep, clock steps, declare, stats, queue info, waker).
// Checked beyond "no crash": every status is one the header documents for that call, a
// popped payload is byte for byte one that was pushed to the same queue, partition and
// offset, and the engine-wide bounds hold after every operation.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "fuzz_util.hpp"
#include "queen_ephemeral.h"

namespace {

struct Input {
    const uint8_t *p;
    size_t n;
    bool empty() const { return n == 0; }
    uint8_t byte() {
        if (n == 0) return 0;
        --n;
        return *p++;
    }
    uint32_t u16() { return byte() | (uint32_t{byte()} << 8); }
};

const char *const kQueues[] = {"q0", "q1", "q2", ""};
const char *const kParts[] = {"p0", "p1"};
const char *const kGroups[] = {"g0", "g1"};

int64_t stat_number(const std::string &json, const char *key) {
    const std::string k = std::string("\"") + key + "\":";
    const size_t at = json.find(k);
    if (at == std::string::npos) qsw_fuzz::broken("stats lacks a key", key);
    return std::strtoll(json.c_str() + at + k.size(), nullptr, 10);
}

int wakes = 0;
void count_wake(void *, int64_t) { ++wakes; }

bool one_of(int rc, std::initializer_list<int> allowed) {
    for (int a : allowed)
        if (rc == a) return true;
    return false;
}

struct Delivery {
    int q, p, g;
    int64_t offset;
    uint64_t lease;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Input in{data, size};
    queen_ephemeral_config cfg;
    queen_ephemeral_config_init(&cfg);
    cfg.max_messages = in.byte() % 17;
    cfg.max_bytes = in.u16() % 4097;
    cfg.overflow = in.byte() % 3;  // 2 is not a policy: create must refuse it
    cfg.lease_ms = (in.byte() % 5) * 250;  // 0 must be refused
    cfg.max_retries = in.byte() % 4;
    cfg.ttl_ms = (in.byte() % 3) * 400;
    cfg.idle_gc_ms = (in.byte() % 3) * 1000;
    cfg.max_payload_bytes = in.u16() % 513;  // 0 must be refused
    cfg.max_queues = in.byte() % 4;
    cfg.max_groups = in.byte() % 3;

    queen_ephemeral *e = nullptr;
    const int crc = queen_ephemeral_create(&cfg, &e);
    const bool valid = cfg.overflow <= 1 && cfg.lease_ms > 0 && cfg.max_payload_bytes > 0;
    QSW_FUZZ_CHECK((crc == QUEEN_EPHEMERAL_OK) == valid,
                   std::string("create: ") + queen_ephemeral_last_error());
    if (crc != QUEEN_EPHEMERAL_OK) {
        QSW_FUZZ_CHECK(e == nullptr, "failed create left a handle");
        return 0;
    }

    int64_t now = 1'700'000'000'000;
    std::map<std::tuple<int, int, int64_t>, std::string> pushed;
    int64_t last_offset[4][2] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}};
    std::vector<Delivery> deliveries;
    std::string stats(256, '\0');

    // QUEEN_FUZZ_TRACE=1 prints the program as it runs, to read a crashing input.
    static const bool trace = std::getenv("QUEEN_FUZZ_TRACE") != nullptr;
    while (!in.empty()) {
        const uint8_t op = in.byte();
        const int q = in.byte() % 4, p = op >> 7, g = (op >> 6) & 1;
        if (trace) std::fprintf(stderr, "op %d q%d p%d g%d now %lld\n", op % 10, q, p, g,
                                static_cast<long long>(now));
        switch (op % 10) {
        case 0: {  // push
            const size_t len = in.byte() * 3 % 600;
            std::string payload(len, '\0');
            for (size_t i = 0; i < len; ++i) payload[i] = static_cast<char>(i * 31 + q + len);
            int64_t offset = -1;
            const int rc = queen_ephemeral_push(e, kQueues[q], kParts[p], payload.data(), len,
                                                now, &offset);
            QSW_FUZZ_CHECK(one_of(rc, {QUEEN_EPHEMERAL_OK, QUEEN_EPHEMERAL_EINVAL,
                                       QUEEN_EPHEMERAL_EFULL}),
                           "push status " + std::to_string(rc));
            if (q == 3) QSW_FUZZ_CHECK(rc == QUEEN_EPHEMERAL_EINVAL, "empty queue name accepted");
            if (len > cfg.max_payload_bytes)
                QSW_FUZZ_CHECK(rc == QUEEN_EPHEMERAL_EINVAL, "oversized payload accepted");
            if (trace) {
                queen_ephemeral_queue_state st{};
                st.struct_size = sizeof st;
                const int irc = queen_ephemeral_queue_info(e, kQueues[q], &st);
                std::fprintf(stderr, "  push rc %d offset %lld; queue info rc %d declared %d messages %llu\n",
                             rc, static_cast<long long>(offset), irc, st.declared,
                             static_cast<unsigned long long>(st.messages));
            }
            if (rc == QUEEN_EPHEMERAL_OK) {
                QSW_FUZZ_CHECK(offset >= 0, "push gave no offset");
                auto &last = last_offset[q][p];
                if (offset <= last) {
                    // A ring starts again when its queue was collected (implicit, idle,
                    // empty): what the model remembers of that queue is gone with it.
                    // (corpus/declared_ring_restarts_at_0 shows a declared queue's ring
                    // restarting too; the header does not promise otherwise, so it is
                    // reported, not asserted.)
                    for (auto it = pushed.begin(); it != pushed.end();)
                        it = std::get<0>(it->first) == q && std::get<1>(it->first) == p
                                 ? pushed.erase(it)
                                 : std::next(it);
                }
                last = offset;
                QSW_FUZZ_CHECK(pushed.emplace(std::make_tuple(q, p, offset), payload).second,
                               "an offset was handed out twice");
            }
            break;
        }
        case 1: {  // pop
            queen_ephemeral_message m{};
            m.struct_size = sizeof m;
            const uint32_t lease = (in.byte() % 4) * 300;
            const int rc = queen_ephemeral_pop(e, kQueues[q], kParts[p], kGroups[g], lease, now, &m);
            QSW_FUZZ_CHECK(one_of(rc, {QUEEN_EPHEMERAL_OK, QUEEN_EPHEMERAL_EAGAIN,
                                       QUEEN_EPHEMERAL_EINVAL, QUEEN_EPHEMERAL_EFULL}),
                           "pop status " + std::to_string(rc));
            if (rc != QUEEN_EPHEMERAL_OK) {
                QSW_FUZZ_CHECK(m.payload == nullptr && m.payload_len == 0, "failed pop payload");
                break;
            }
            const auto it = pushed.find(std::make_tuple(q, p, m.offset));
            QSW_FUZZ_CHECK(it != pushed.end(), "popped an offset never pushed there");
            QSW_FUZZ_CHECK(it->second.size() == m.payload_len &&
                               (m.payload_len == 0 ||
                                std::memcmp(it->second.data(), m.payload, m.payload_len) == 0),
                           "popped payload differs from the pushed one");
            QSW_FUZZ_CHECK(m.lease_id != 0 && m.attempt >= 1, "lease id or attempt");
            queen_ephemeral_message_free(&m);
            queen_ephemeral_message_free(&m);  // documented as harmless
            deliveries.push_back({q, p, g, m.offset, m.lease_id});
            break;
        }
        case 2: {  // ack a delivery we saw, by offset, lease or both
            if (deliveries.empty()) break;
            const Delivery d = deliveries[in.byte() % deliveries.size()];
            const uint8_t how = in.byte();
            const int64_t offset = how & 1 ? d.offset : -1;
            const uint64_t lease = how & 2 ? d.lease : 0;
            const int outcome = (how >> 2) % 4;  // 3 is not an outcome
            const int rc = queen_ephemeral_ack(e, kQueues[d.q], kParts[d.p], kGroups[d.g], offset,
                                               lease, outcome, now);
            QSW_FUZZ_CHECK(one_of(rc, {QUEEN_EPHEMERAL_OK, QUEEN_EPHEMERAL_ENOENT,
                                       QUEEN_EPHEMERAL_ESTALE, QUEEN_EPHEMERAL_EINVAL}),
                           "ack status " + std::to_string(rc));
            if (outcome == 3 || (offset == -1 && lease == 0))
                QSW_FUZZ_CHECK(rc == QUEEN_EPHEMERAL_EINVAL, "a bad ack was not refused");
            break;
        }
        case 3: {  // sweep
            queen_ephemeral_sweep_result r{};
            r.struct_size = sizeof r;
            QSW_FUZZ_CHECK(queen_ephemeral_sweep(e, now, &r) == QUEEN_EPHEMERAL_OK, "sweep");
            QSW_FUZZ_CHECK(r.next_expiry_unix_ms == -1 || r.next_expiry_unix_ms > 0, "expiry");
            break;
        }
        case 4:  // time passes, sometimes a lot
            now += int64_t{in.byte()} * (op & 0x80 ? 1000 : 10);
            break;
        case 5:  // the host's clock steps back
            now -= int64_t{in.byte()} * 10;
            break;
        case 6: {  // declare
            queen_ephemeral_queue_options o;
            queen_ephemeral_queue_options_init(&o);
            const uint8_t which = in.byte();
            if (which & 1) o.max_messages = in.byte() % 9;
            if (which & 2) o.max_bytes = in.u16() % 2049;
            if (which & 4) o.overflow = in.byte() % 3;
            if (which & 8) o.lease_ms = static_cast<int64_t>(in.byte() % 5) * 200;
            if (which & 16) o.max_retries = in.byte() % 3;
            if (which & 32) o.ttl_ms = static_cast<int64_t>(in.byte() % 3) * 300;
            if (which & 64) o.max_messages = -2;  // neither INHERIT nor a count
            // Declaring a queue that was collected (or never existed) starts new rings.
            queen_ephemeral_queue_state before{};
            before.struct_size = sizeof before;
            const bool existed = queen_ephemeral_queue_info(e, kQueues[q], &before) == QUEEN_EPHEMERAL_OK;
            const int rc = queen_ephemeral_declare(e, kQueues[q], &o);
            if (rc == QUEEN_EPHEMERAL_OK && !existed) {
                for (auto it = pushed.begin(); it != pushed.end();)
                    it = std::get<0>(it->first) == q ? pushed.erase(it) : std::next(it);
                for (auto &l : last_offset[q]) l = -1;
            }
            QSW_FUZZ_CHECK(one_of(rc, {QUEEN_EPHEMERAL_OK, QUEEN_EPHEMERAL_EINVAL,
                                       QUEEN_EPHEMERAL_EFULL}),
                           "declare status " + std::to_string(rc));
            if (which & 64) QSW_FUZZ_CHECK(rc == QUEEN_EPHEMERAL_EINVAL, "max_messages -2 accepted");
            if (trace) std::fprintf(stderr, "  declare rc %d existed %d\n", rc, existed);
            break;
        }
        case 7: {  // stats: the engine-wide bounds hold
            int64_t n = queen_ephemeral_stats(e, stats.data(), stats.size());
            QSW_FUZZ_CHECK(n >= 0, "stats failed");
            if (static_cast<size_t>(n) >= stats.size()) {
                stats.assign(static_cast<size_t>(n) + 1, '\0');
                n = queen_ephemeral_stats(e, stats.data(), stats.size());
            }
            const std::string text(stats.data(), static_cast<size_t>(n));
            const int64_t messages = stat_number(text, "messages");
            const int64_t bytes = stat_number(text, "bytes");
            if (cfg.max_messages)
                QSW_FUZZ_CHECK(messages <= static_cast<int64_t>(cfg.max_messages), text);
            if (cfg.max_bytes) QSW_FUZZ_CHECK(bytes <= static_cast<int64_t>(cfg.max_bytes), text);
            break;
        }
        case 8: {  // queue info
            queen_ephemeral_queue_state s{};
            s.struct_size = sizeof s;
            const int rc = queen_ephemeral_queue_info(e, kQueues[q], &s);
            QSW_FUZZ_CHECK(one_of(rc, {QUEEN_EPHEMERAL_OK, QUEEN_EPHEMERAL_ENOENT,
                                       QUEEN_EPHEMERAL_EINVAL}),
                           "queue_info status " + std::to_string(rc));
            if (rc == QUEEN_EPHEMERAL_OK) QSW_FUZZ_CHECK(s.in_flight <= s.messages * 2, "in flight");
            break;
        }
        case 9:  // attach or detach the waker
            QSW_FUZZ_CHECK(queen_ephemeral_attach_waker(e, op & 0x40 ? nullptr : count_wake,
                                                        nullptr) == QUEEN_EPHEMERAL_OK,
                           "attach_waker");
            break;
        }
    }
    queen_ephemeral_destroy(&e);
    QSW_FUZZ_CHECK(e == nullptr, "destroy did not clear the handle");
    return 0;
}
