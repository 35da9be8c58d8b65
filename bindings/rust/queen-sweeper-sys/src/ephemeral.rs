//! Raw declarations of `plugins/ephemeral/queen_ephemeral.h` (ABI v1), the
//! in-RAM ephemeral queue engine (libqueen_ephemeral.so). Behind the
//! `ephemeral` feature, which links that library too.

use core::ffi::{c_char, c_int, c_void};

pub const QUEEN_EPHEMERAL_ABI_MAJOR: u32 = 1;
pub const QUEEN_EPHEMERAL_ABI_MINOR: u32 = 0;

pub const QUEEN_EPHEMERAL_OK: c_int = 0;
pub const QUEEN_EPHEMERAL_EINVAL: c_int = -22;
pub const QUEEN_EPHEMERAL_ENOMEM: c_int = -12;
pub const QUEEN_EPHEMERAL_ENOENT: c_int = -2;
pub const QUEEN_EPHEMERAL_EAGAIN: c_int = -11;
pub const QUEEN_EPHEMERAL_EFULL: c_int = -28;
pub const QUEEN_EPHEMERAL_ESTALE: c_int = -116;
pub const QUEEN_EPHEMERAL_EINTERNAL: c_int = -5;

pub const QUEEN_EPHEMERAL_MAX_NAME: usize = 255;

pub const QUEEN_EPHEMERAL_OVERFLOW_REJECT: i32 = 0;
pub const QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST: i32 = 1;

pub const QUEEN_EPHEMERAL_ACK_COMPLETED: c_int = 0;
pub const QUEEN_EPHEMERAL_ACK_RETRY: c_int = 1;
pub const QUEEN_EPHEMERAL_ACK_FAILED: c_int = 2;

pub const QUEEN_EPHEMERAL_INHERIT: i64 = -1;

/// The opaque engine handle.
#[repr(C)]
pub struct queen_ephemeral {
    _opaque: [u8; 0],
    _marker: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct queen_ephemeral_config {
    pub struct_size: usize,
    pub max_bytes: u64,
    pub max_messages: u64,
    pub queue_max_bytes: u64,
    pub queue_max_messages: u64,
    pub overflow: i32,
    pub lease_ms: u32,
    pub max_retries: u32,
    pub ttl_ms: u64,
    pub idle_gc_ms: u64,
    pub max_payload_bytes: u64,
    pub max_queues: u32,
    pub max_groups: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct queen_ephemeral_queue_options {
    pub struct_size: usize,
    pub max_bytes: i64,
    pub max_messages: i64,
    pub overflow: i64,
    pub lease_ms: i64,
    pub max_retries: i64,
    pub ttl_ms: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct queen_ephemeral_message {
    pub struct_size: usize,
    pub offset: i64,
    pub lease_id: u64,
    pub attempt: u32,
    pub lease_expires_unix_ms: i64,
    pub pushed_unix_ms: i64,
    pub payload: *mut u8,
    pub payload_len: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct queen_ephemeral_sweep_result {
    pub struct_size: usize,
    pub redelivered: u64,
    pub exhausted: u64,
    pub ttl_dropped: u64,
    pub queues_collected: u64,
    pub next_expiry_unix_ms: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct queen_ephemeral_queue_state {
    pub struct_size: usize,
    pub declared: i32,
    pub partitions: u32,
    pub groups: u32,
    pub messages: u64,
    pub bytes: u64,
    pub in_flight: u64,
    pub next_expiry_unix_ms: i64,
}

pub type queen_ephemeral_wake_fn = Option<unsafe extern "C" fn(wake_ctx: *mut c_void, at_unix_ms: i64)>;

extern "C" {
    pub fn queen_ephemeral_abi_version() -> u32;
    pub fn queen_ephemeral_version() -> *const c_char;
    pub fn queen_ephemeral_config_init(cfg: *mut queen_ephemeral_config);
    pub fn queen_ephemeral_create(cfg: *const queen_ephemeral_config, out: *mut *mut queen_ephemeral) -> c_int;
    pub fn queen_ephemeral_destroy(e: *mut *mut queen_ephemeral);
    pub fn queen_ephemeral_queue_options_init(opts: *mut queen_ephemeral_queue_options);
    pub fn queen_ephemeral_declare(
        e: *mut queen_ephemeral,
        queue: *const c_char,
        opts: *const queen_ephemeral_queue_options,
    ) -> c_int;
    pub fn queen_ephemeral_push(
        e: *mut queen_ephemeral,
        queue: *const c_char,
        partition: *const c_char,
        payload: *const c_void,
        len: usize,
        now_unix_ms: i64,
        out_offset: *mut i64,
    ) -> c_int;
    pub fn queen_ephemeral_pop(
        e: *mut queen_ephemeral,
        queue: *const c_char,
        partition: *const c_char,
        group: *const c_char,
        lease_ms: u32,
        now_unix_ms: i64,
        out: *mut queen_ephemeral_message,
    ) -> c_int;
    pub fn queen_ephemeral_ack(
        e: *mut queen_ephemeral,
        queue: *const c_char,
        partition: *const c_char,
        group: *const c_char,
        offset: i64,
        lease_id: u64,
        outcome: c_int,
        now_unix_ms: i64,
    ) -> c_int;
    pub fn queen_ephemeral_sweep(
        e: *mut queen_ephemeral,
        now_unix_ms: i64,
        out: *mut queen_ephemeral_sweep_result,
    ) -> c_int;
    pub fn queen_ephemeral_attach_waker(
        e: *mut queen_ephemeral,
        wake: queen_ephemeral_wake_fn,
        wake_ctx: *mut c_void,
    ) -> c_int;
    pub fn queen_ephemeral_last_error() -> *const c_char;
    pub fn queen_ephemeral_stats(e: *mut queen_ephemeral, buf: *mut c_char, cap: usize) -> i64;
    pub fn queen_ephemeral_queue_info(
        e: *mut queen_ephemeral,
        queue: *const c_char,
        out: *mut queen_ephemeral_queue_state,
    ) -> c_int;
    pub fn queen_ephemeral_message_free(msg: *mut queen_ephemeral_message);
    pub fn queen_ephemeral_backstop(e: *mut queen_ephemeral, out_provider: *mut c_void, out_size: usize) -> c_int;
}
