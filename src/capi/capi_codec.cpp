// The C shim for section 6 of the header ("Memory and codec"). Every function is a guard:
// check the arguments, make one call into the codec, turn every exception into a status and
// a last-error message. Nothing thrown here may reach the host.
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "queen_sweeper.h"

#include "base/last_error.hpp"
#include "codec/codec.hpp"

struct queen_sweeper_segment {
    qsw::DecodedSegment decoded;
};

namespace {

// The frame struct as ABI 1.0 defined it; a caller may know a longer one (a later minor) but
// never a shorter one, because then we would write past the end of its memory.
constexpr size_t kFrameV1Size = offsetof(queen_sweeper_frame, payload_len) + sizeof(size_t);

int fail(int status, std::string message) {
    qsw::set_last_error(std::move(message));
    return status;
}

// The catch-all every exported function ends with; `fn` names the function in the message.
// It is itself noexcept: building the message may fail for want of memory, and then the
// status alone has to do.
int fail_current_exception(const char *fn) noexcept {
    int status = QUEEN_SWEEPER_EINTERNAL;
    const char *what = "unknown exception";
    try {
        throw;
    } catch (const std::bad_alloc &) {
        status = QUEEN_SWEEPER_ENOMEM;
        what = "out of memory";
    } catch (const std::exception &e) {
        what = e.what();
    } catch (...) {
    }
    try {
        qsw::set_last_error(std::string(fn) + ": " + what);
    } catch (...) {
    }
    return status;
}

}  // namespace

extern "C" {

QUEEN_SWEEPER_API int queen_sweeper_segment_decode(const uint8_t *blob, size_t len,
                                                   queen_sweeper_segment **out) {
    constexpr const char *kFn = "queen_sweeper_segment_decode";
    try {
        if (out == nullptr) return fail(QUEEN_SWEEPER_EINVAL, std::string(kFn) + ": out is NULL");
        *out = nullptr;
        if (blob == nullptr)
            return fail(QUEEN_SWEEPER_EINVAL, std::string(kFn) + ": blob is NULL");
        auto seg = std::make_unique<queen_sweeper_segment>();
        std::string error;
        if (!qsw::decode_segment(blob, len, seg->decoded, error))
            return fail(QUEEN_SWEEPER_ECORRUPT, std::move(error));
        *out = seg.release();
        return QUEEN_SWEEPER_OK;
    } catch (...) {
        return fail_current_exception(kFn);
    }
}

QUEEN_SWEEPER_API size_t queen_sweeper_segment_count(const queen_sweeper_segment *seg) {
    return seg == nullptr ? 0 : seg->decoded.frames.size();
}

QUEEN_SWEEPER_API int queen_sweeper_segment_frame(const queen_sweeper_segment *seg, size_t index,
                                                  queen_sweeper_frame *out) {
    constexpr const char *kFn = "queen_sweeper_segment_frame";
    try {
        if (seg == nullptr) return fail(QUEEN_SWEEPER_EINVAL, std::string(kFn) + ": seg is NULL");
        if (out == nullptr) return fail(QUEEN_SWEEPER_EINVAL, std::string(kFn) + ": out is NULL");
        if (out->struct_size < kFrameV1Size)
            return fail(QUEEN_SWEEPER_EINVAL, std::string(kFn) + ": out->struct_size is " +
                                                  std::to_string(out->struct_size) + ", at least " +
                                                  std::to_string(kFrameV1Size) + " is needed");
        const auto &frames = seg->decoded.frames;
        if (index >= frames.size())
            return fail(QUEEN_SWEEPER_EINVAL, std::string(kFn) + ": index " + std::to_string(index) +
                                                  " is out of range (the segment has " +
                                                  std::to_string(frames.size()) + " frames)");
        const qsw::FrameView &f = frames[index];
        // Only the 1.0 fields are written: struct_size stays the caller's, and any tail a later
        // minor adds is not ours to touch.
        out->flags = f.flags;
        std::memcpy(out->message_id, f.message_id, sizeof out->message_id);
        if (f.trace_id)
            std::memcpy(out->trace_id, f.trace_id, sizeof out->trace_id);
        else
            std::memset(out->trace_id, 0, sizeof out->trace_id);
        out->txn = f.txn.data();
        out->txn_len = f.txn.size();
        out->producer_sub = f.producer_sub ? f.producer_sub->data() : nullptr;
        out->producer_sub_len = f.producer_sub ? f.producer_sub->size() : 0;
        out->payload = reinterpret_cast<const uint8_t *>(f.payload.data());
        out->payload_len = f.payload.size();
        return QUEEN_SWEEPER_OK;
    } catch (...) {
        return fail_current_exception(kFn);
    }
}

QUEEN_SWEEPER_API void queen_sweeper_segment_free(queen_sweeper_segment **seg) {
    if (seg == nullptr) return;
    delete *seg;
    *seg = nullptr;
}

QUEEN_SWEEPER_API int queen_sweeper_txn_hash(const char *txn, size_t len, uint8_t out16[16]) {
    constexpr const char *kFn = "queen_sweeper_txn_hash";
    try {
        if (out16 == nullptr)
            return fail(QUEEN_SWEEPER_EINVAL, std::string(kFn) + ": out16 is NULL");
        if (txn == nullptr && len > 0)
            return fail(QUEEN_SWEEPER_EINVAL,
                        std::string(kFn) + ": txn is NULL with len " + std::to_string(len));
        qsw::txn_hash(std::string_view(txn == nullptr ? "" : txn, len), out16);
        return QUEEN_SWEEPER_OK;
    } catch (...) {
        return fail_current_exception(kFn);
    }
}

}  // extern "C"
