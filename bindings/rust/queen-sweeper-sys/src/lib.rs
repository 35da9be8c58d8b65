//! Raw declarations of `abi/queen_sweeper.h` (ABI v1), written by hand.
//!
//! Every item mirrors the header one to one, in the header's order: version,
//! types, lifecycle, control, introspection, memory and codec, plugin entry.
//! The documentation of each function (ownership, statuses, thread safety)
//! is the header's; it is not repeated here. Use the `queen-sweeper` crate
//! for a safe owner type.

#![no_std]
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};

#[cfg(feature = "ephemeral")]
pub mod ephemeral;

// ---------------------------------------------------------------------------
// 1. Version
// ---------------------------------------------------------------------------

pub const QUEEN_SWEEPER_ABI_MAJOR: u32 = 1;
pub const QUEEN_SWEEPER_ABI_MINOR: u32 = 1;
pub const QUEEN_SWEEPER_VERSION_MAJOR: u32 = 1;
pub const QUEEN_SWEEPER_VERSION_MINOR: u32 = 1;
pub const QUEEN_SWEEPER_VERSION_PATCH: u32 = 0;

// ---------------------------------------------------------------------------
// 2. Types
// ---------------------------------------------------------------------------

pub const QUEEN_SWEEPER_OK: c_int = 0;
pub const QUEEN_SWEEPER_EINVAL: c_int = -22;
pub const QUEEN_SWEEPER_ENOMEM: c_int = -12;
pub const QUEEN_SWEEPER_ESTATE: c_int = -16;
pub const QUEEN_SWEEPER_ETIMEDOUT: c_int = -110;
pub const QUEEN_SWEEPER_ECORRUPT: c_int = -74;
pub const QUEEN_SWEEPER_EVERSION: c_int = -95;
pub const QUEEN_SWEEPER_EINTERNAL: c_int = -5;

/// The opaque sweeper handle.
#[repr(C)]
pub struct queen_sweeper {
    _opaque: [u8; 0],
    // Not Send, not Sync, not Unpin: only ever behind a raw pointer.
    _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
}

pub const QUEEN_SWEEPER_LOG_ERROR: c_int = 0;
pub const QUEEN_SWEEPER_LOG_WARN: c_int = 1;
pub const QUEEN_SWEEPER_LOG_INFO: c_int = 2;
pub const QUEEN_SWEEPER_LOG_DEBUG: c_int = 3;

pub type queen_sweeper_log_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, level: c_int, message: *const c_char)>;

pub type queen_sweeper_fired_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        tenant: *const c_char,
        queue: *const c_char,
        partition: *const c_char,
        count: u32,
        base_offset: i64,
    ),
>;

pub type queen_sweeper_wake_fn = Option<unsafe extern "C" fn(wake_ctx: *mut c_void, at_unix_ms: i64)>;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct queen_sweeper_backstop_result {
    pub struct_size: usize,
    pub redelivered: u64,
    pub exhausted: u64,
    pub ttl_dropped: u64,
    pub queues_collected: u64,
    pub next_expiry_unix_ms: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct queen_sweeper_backstop {
    pub struct_size: usize,
    pub ctx: *mut c_void,
    pub sweep: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            now_unix_ms: i64,
            out: *mut queen_sweeper_backstop_result,
        ) -> c_int,
    >,
    pub attach_waker:
        Option<unsafe extern "C" fn(ctx: *mut c_void, wake: queen_sweeper_wake_fn, wake_ctx: *mut c_void)>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct queen_sweeper_frame {
    pub struct_size: usize,
    pub flags: u8,
    pub message_id: [u8; 16],
    pub trace_id: [u8; 16],
    pub txn: *const c_char,
    pub txn_len: usize,
    pub producer_sub: *const c_char,
    pub producer_sub_len: usize,
    pub payload: *const u8,
    pub payload_len: usize,
}

pub const QUEEN_SWEEPER_FRAME_TRACE_ID: u8 = 1;
pub const QUEEN_SWEEPER_FRAME_PRODUCER_SUB: u8 = 2;
pub const QUEEN_SWEEPER_FRAME_ENCRYPTED: u8 = 4;

/// A decoded segment (opaque).
#[repr(C)]
pub struct queen_sweeper_segment {
    _opaque: [u8; 0],
    _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
}

// ---------------------------------------------------------------------------
// 7. Plugin entry (types)
// ---------------------------------------------------------------------------

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct queen_sweeper_api {
    pub struct_size: usize,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub abi_version: Option<unsafe extern "C" fn() -> u32>,
    pub version: Option<unsafe extern "C" fn() -> *const c_char>,
    pub create: Option<unsafe extern "C" fn(config_json: *const c_char, out: *mut *mut queen_sweeper) -> c_int>,
    pub set_log_callback:
        Option<unsafe extern "C" fn(sw: *mut queen_sweeper, fn_: queen_sweeper_log_fn, user: *mut c_void) -> c_int>,
    pub set_fired_callback:
        Option<unsafe extern "C" fn(sw: *mut queen_sweeper, fn_: queen_sweeper_fired_fn, user: *mut c_void) -> c_int>,
    pub set_backstop:
        Option<unsafe extern "C" fn(sw: *mut queen_sweeper, provider: *const queen_sweeper_backstop) -> c_int>,
    pub start: Option<unsafe extern "C" fn(sw: *mut queen_sweeper) -> c_int>,
    pub stop: Option<unsafe extern "C" fn(sw: *mut queen_sweeper, timeout_ms: u32) -> c_int>,
    pub destroy: Option<unsafe extern "C" fn(sw: *mut *mut queen_sweeper)>,
    pub wake: Option<unsafe extern "C" fn(sw: *mut queen_sweeper, deliver_at_unix_ms: i64)>,
    pub last_error: Option<unsafe extern "C" fn() -> *const c_char>,
    pub stats: Option<unsafe extern "C" fn(sw: *mut queen_sweeper, buf: *mut c_char, cap: usize) -> i64>,
    pub metrics: Option<unsafe extern "C" fn(sw: *mut queen_sweeper, buf: *mut c_char, cap: usize) -> i64>,
    pub segment_decode:
        Option<unsafe extern "C" fn(blob: *const u8, len: usize, out: *mut *mut queen_sweeper_segment) -> c_int>,
    pub segment_count: Option<unsafe extern "C" fn(seg: *const queen_sweeper_segment) -> usize>,
    pub segment_frame: Option<
        unsafe extern "C" fn(seg: *const queen_sweeper_segment, index: usize, out: *mut queen_sweeper_frame) -> c_int,
    >,
    pub segment_free: Option<unsafe extern "C" fn(seg: *mut *mut queen_sweeper_segment)>,
    pub txn_hash: Option<unsafe extern "C" fn(txn: *const c_char, len: usize, out16: *mut u8) -> c_int>,
    // Since 1.1: read only when struct_size covers them.
    pub wait_ready: Option<unsafe extern "C" fn(sw: *mut queen_sweeper, timeout_ms: u32) -> c_int>,
    pub status_name: Option<unsafe extern "C" fn(status: c_int) -> *const c_char>,
}

pub type queen_sweeper_get_api_fn = Option<unsafe extern "C" fn(abi_major: u32) -> *const queen_sweeper_api>;

extern "C" {
    // 1. Version
    pub fn queen_sweeper_abi_version() -> u32;
    pub fn queen_sweeper_version() -> *const c_char;

    // 3. Lifecycle
    pub fn queen_sweeper_create(config_json: *const c_char, out: *mut *mut queen_sweeper) -> c_int;
    pub fn queen_sweeper_set_log_callback(
        sw: *mut queen_sweeper,
        fn_: queen_sweeper_log_fn,
        user: *mut c_void,
    ) -> c_int;
    pub fn queen_sweeper_set_fired_callback(
        sw: *mut queen_sweeper,
        fn_: queen_sweeper_fired_fn,
        user: *mut c_void,
    ) -> c_int;
    pub fn queen_sweeper_set_backstop(sw: *mut queen_sweeper, provider: *const queen_sweeper_backstop) -> c_int;
    pub fn queen_sweeper_start(sw: *mut queen_sweeper) -> c_int;
    pub fn queen_sweeper_stop(sw: *mut queen_sweeper, timeout_ms: u32) -> c_int;
    pub fn queen_sweeper_destroy(sw: *mut *mut queen_sweeper);

    // 4. Control
    pub fn queen_sweeper_wake(sw: *mut queen_sweeper, deliver_at_unix_ms: i64);

    // 5. Introspection
    pub fn queen_sweeper_last_error() -> *const c_char;
    pub fn queen_sweeper_stats(sw: *mut queen_sweeper, buf: *mut c_char, cap: usize) -> i64;
    pub fn queen_sweeper_metrics(sw: *mut queen_sweeper, buf: *mut c_char, cap: usize) -> i64;

    // 6. Memory and codec
    pub fn queen_sweeper_segment_decode(blob: *const u8, len: usize, out: *mut *mut queen_sweeper_segment) -> c_int;
    pub fn queen_sweeper_segment_count(seg: *const queen_sweeper_segment) -> usize;
    pub fn queen_sweeper_segment_frame(
        seg: *const queen_sweeper_segment,
        index: usize,
        out: *mut queen_sweeper_frame,
    ) -> c_int;
    pub fn queen_sweeper_segment_free(seg: *mut *mut queen_sweeper_segment);
    pub fn queen_sweeper_txn_hash(txn: *const c_char, len: usize, out16: *mut u8) -> c_int;

    // 7. Plugin entry
    pub fn queen_sweeper_get_api(abi_major: u32) -> *const queen_sweeper_api;

    // Since 1.1 (section 5, introspection).
    pub fn queen_sweeper_wait_ready(sw: *mut queen_sweeper, timeout_ms: u32) -> c_int;
    pub fn queen_sweeper_status_name(status: c_int) -> *const c_char;
}

#[cfg(test)]
mod layout {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    // The x86-64 / aarch64 LP64 layout the C compiler gives the header's structs.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn frame_layout_matches_c() {
        assert_eq!(offset_of!(queen_sweeper_frame, flags), 8);
        assert_eq!(offset_of!(queen_sweeper_frame, message_id), 9);
        assert_eq!(offset_of!(queen_sweeper_frame, trace_id), 25);
        assert_eq!(offset_of!(queen_sweeper_frame, txn), 48);
        assert_eq!(offset_of!(queen_sweeper_frame, payload_len), 88);
        assert_eq!(size_of::<queen_sweeper_frame>(), 96);
        assert_eq!(align_of::<queen_sweeper_frame>(), 8);
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn backstop_layout_matches_c() {
        assert_eq!(size_of::<queen_sweeper_backstop_result>(), 48);
        assert_eq!(size_of::<queen_sweeper_backstop>(), 32);
        assert_eq!(offset_of!(queen_sweeper_api, abi_version), 16);
        // 1.0 had 18 functions; 1.1 appended wait_ready and status_name.
        assert_eq!(size_of::<queen_sweeper_api>(), 16 + 20 * 8);
    }
}
