// The claim book: the one place a claimed row's life is kept, from its claim to its
// settlement, whatever part of the sweeper carries it meanwhile.
//
// A row enters when its claim is decoded (claimed) and leaves when it is settled: fired, a
// duplicate, failed, handed back, or found in the log after a lost answer. Between the two
// it is in one state at a time:
//
//   claimed  decoded, not in a call
//   firing   in a fire call in flight (at most one: a row in two calls at once is refused)
//   kept     its segment came back busy (a partition or queue name someone holds): tried
//            again later by the drain, still ours
//   parked   a call's answer was lost: resolved by the recovery once the server answers
//
// What may happen to a row in each state is the pure function row_next, tested at both ends
// (tests/unit/claim_book_test.cpp); the book applies it and counts, never ignores, a move
// the function refuses (a row settled twice, sent while in flight): such a move is a bug of
// this library, said once per cause in the log and counted in stats (claims.refused_moves_total).
//
// Entries are keyed by (tenant, queue, timer key, claim token): a row claimed again under
// another claim (its lease lapsed while the first was parked) is another entry, and settling
// one never forgets the other. Whatever is in the book at a graceful stop is handed back,
// token-matched, in one call (Sweeper::release_held).
//
// Every claimed row passes through here on the drain's hot path: one hash table keyed by the
// four names joined with NUL (a byte no PostgreSQL text value holds, so two different rows
// never join to the same key); lookups build their key in a reused buffer. Loop thread only.
#pragma once
#include <array>
#include <memory>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "codec/packer.hpp"

namespace qsw {

// A claim's rows, shared by whatever still has a part of them to settle (the claim's own
// pass, its kept segments, its parked fires): each of those is indexes into the claim's rows,
// never a copy of part of them, so a later replay (one timer per call) packs each row's own
// payload and a row's state is the book's alone.
using ClaimRows = std::shared_ptr<std::vector<ClaimedTimer>>;

enum class RowState : uint8_t { claimed, firing, kept, parked };
inline constexpr size_t kRowStates = 4;
const char *row_state_name(RowState s);

enum class RowEvent : uint8_t {
    sent,         // put in a fire call
    busy,         // the fire left its segment busy (or waited out its lock): kept
    call_failed,  // the fire call failed and the row is still ours, out of any call (replayed one by one)
    answer_lost,  // the call's answer was lost (the connection, a read-only server): parked
    settled,      // fired, duplicate, failed, handed back, found in the log: leaves the book
};
const char *row_event_name(RowEvent e);

// Where a move leaves a row: in the book in `next`, out of it (settled), or refused (a move
// the state does not make; the row stays as it was).
struct RowMove {
    bool legal = false;
    bool leaves = false;  // legal and settled: out of the book
    RowState next = RowState::claimed;
};
RowMove row_next(RowState from, RowEvent e);

// What the book holds, by state, and the moves it refused (stats: claims.*).
struct ClaimBookFigures {
    std::array<int64_t, kRowStates> by_state{};
    int64_t refused_moves_total = 0;
};

class ClaimBook {
public:
    // A row of a decoded claim enters, claimed. Entering a row already in the book is refused
    // (counted) and leaves its entry as it was.
    void enter(const ClaimedTimer &t);
    // Moves one row (row_next). A row not in the book, or a move its state does not make, is
    // refused: counted, and false. Settled: the row leaves the book.
    bool move(const ClaimedTimer &t, RowEvent e) { return move(t.tenant, t.queue, t.timer_key, t.claim_token, e); }
    bool move(std::string_view tenant, std::string_view queue, std::string_view timer_key, std::string_view token,
              RowEvent e);
    bool holds(const ClaimedTimer &t) const { return state_of(t).has_value(); }
    std::optional<RowState> state_of(const ClaimedTimer &t) const;
    bool empty() const { return rows_.empty(); }
    size_t size() const { return rows_.size(); }
    // At a graceful stop, once every row was handed back in one call: all settled.
    void settle_all();
    // Every row in the book, as fn(tenant, queue, timer_key, claim_token); order unspecified.
    template <class Fn>
    void for_each(Fn &&fn) const {
        for (const auto &[k, state] : rows_) {
            (void)state;
            const std::string_view s(k);
            const size_t a = s.find('\0'), b = s.find('\0', a + 1), c = s.find('\0', b + 1);
            fn(s.substr(0, a), s.substr(a + 1, b - a - 1), s.substr(b + 1, c - b - 1), s.substr(c + 1));
        }
    }
    const ClaimBookFigures &figures() const { return figures_; }
    // The last refused move, for the log (empty: none since the last take).
    std::string take_refusal() { return std::exchange(refusal_, std::string()); }

private:
    void refuse(std::string what);
    const std::string &lookup(std::string_view tenant, std::string_view queue, std::string_view timer_key,
                              std::string_view token) const;

    std::unordered_map<std::string, RowState> rows_;
    ClaimBookFigures figures_;
    std::string refusal_;
    mutable std::string scratch_;  // the lookup key, reused
};

}  // namespace qsw
