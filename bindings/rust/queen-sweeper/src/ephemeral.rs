//! The in-RAM ephemeral queue engine (libqueen_ephemeral.so), and handing it
//! to a sweeper as its once-a-second backstop. Enabled by the `ephemeral` feature.
//!
//! ```no_run
//! # use queen_sweeper::{Config, Sweeper, ephemeral::{Ephemeral, EphemeralConfig, Outcome, now_ms}};
//! # use std::sync::Arc;
//! let engine = Arc::new(Ephemeral::new(&EphemeralConfig::new().lease_ms(5000))?);
//! let mut sweeper = Sweeper::new(&Config::new().conninfo("dbname=broker"))?;
//! sweeper.set_ephemeral_backstop(Arc::clone(&engine))?;
//! sweeper.start()?;
//! engine.push("jobs", "p0", b"hello", now_ms())?;
//! if let Some(msg) = engine.pop("jobs", "p0", "workers", 0, now_ms())? {
//!     engine.ack("jobs", "p0", "workers", msg.offset, msg.lease_id, Outcome::Completed, now_ms())?;
//! }
//! # Ok::<(), queen_sweeper::Error>(())
//! ```

use std::ffi::{c_char, c_int, c_void, CString};
use std::mem::size_of;
use std::ptr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{read_snprintf_with, sys, text, Error, Sweeper};
use sys::ephemeral as e;

fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by the library, never NULL; copied at once.
    unsafe { text(e::queen_ephemeral_last_error()) }
}

fn check(status: c_int) -> Result<(), Error> {
    if status < 0 {
        Err(Error::with_message(status.into(), last_error()))
    } else {
        Ok(())
    }
}

fn name(value: &str) -> Result<CString, Error> {
    CString::new(value).map_err(|_| Error::InvalidArgument(format!("name {value:?} contains a NUL byte")))
}

/// The wall clock in unix milliseconds, for the engine's `now` arguments.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// (major, minor) of the loaded engine library.
pub fn abi_version() -> (u32, u32) {
    // SAFETY: no arguments; never fails.
    let packed = unsafe { e::queen_ephemeral_abi_version() };
    (packed >> 16, packed & 0xFFFF)
}

/// What a push does when a bound is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    Reject,
    DropOldest,
}

impl Overflow {
    fn code(self) -> i32 {
        match self {
            Overflow::Reject => e::QUEEN_EPHEMERAL_OVERFLOW_REJECT,
            Overflow::DropOldest => e::QUEEN_EPHEMERAL_OVERFLOW_DROP_OLDEST,
        }
    }
}

/// How an ack settles a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    Retry,
    Failed,
}

/// The engine configuration: the library's defaults, then what you change.
#[derive(Debug, Clone, Copy)]
pub struct EphemeralConfig(e::queen_ephemeral_config);

impl Default for EphemeralConfig {
    fn default() -> Self {
        let mut cfg = e::queen_ephemeral_config::default();
        // SAFETY: cfg is a valid, writable config struct.
        unsafe { e::queen_ephemeral_config_init(&mut cfg) };
        EphemeralConfig(cfg)
    }
}

macro_rules! setter {
    ($name:ident, $ty:ty) => {
        pub fn $name(mut self, value: $ty) -> Self {
            self.0.$name = value;
            self
        }
    };
}

impl EphemeralConfig {
    pub fn new() -> Self {
        Self::default()
    }
    setter!(max_bytes, u64);
    setter!(max_messages, u64);
    setter!(queue_max_bytes, u64);
    setter!(queue_max_messages, u64);
    setter!(lease_ms, u32);
    setter!(max_retries, u32);
    setter!(ttl_ms, u64);
    setter!(idle_gc_ms, u64);
    setter!(max_payload_bytes, u64);
    setter!(max_queues, u32);
    setter!(max_groups, u32);
    pub fn overflow(mut self, policy: Overflow) -> Self {
        self.0.overflow = policy.code();
        self
    }
    /// The raw struct, for fields these bindings do not name.
    pub fn raw(&mut self) -> &mut e::queen_ephemeral_config {
        &mut self.0
    }
}

/// Options of a declared queue; every field left `None` inherits the engine's.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueOptions {
    pub max_bytes: Option<u64>,
    pub max_messages: Option<u64>,
    pub overflow: Option<Overflow>,
    pub lease_ms: Option<u32>,
    pub max_retries: Option<u32>,
    pub ttl_ms: Option<u64>,
}

/// One delivery; settle it with `ack(offset, lease_id, ...)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub offset: i64,
    pub lease_id: u64,
    pub attempt: u32,
    pub lease_expires_unix_ms: i64,
    pub pushed_unix_ms: i64,
    pub payload: Vec<u8>,
}

/// What one sweep did.
pub type SweepResult = e::queen_ephemeral_sweep_result;
/// A queue's shape.
pub type QueueInfo = e::queen_ephemeral_queue_state;

/// One engine. Dropping it destroys it and every message it holds.
pub struct Ephemeral {
    raw: *mut e::queen_ephemeral,
}

// SAFETY (Send + Sync): the engine header documents every call used through
// `&self` (declare, push, pop, ack, sweep, stats, queue_info) as "any thread,
// concurrently with everything but destroy"; destroy runs only in Drop, which
// needs ownership. A sweeper holding the engine as its backstop holds an
// `Arc<Ephemeral>`, so the engine outlives that sweeper's stop and destroy.
// attach_waker is not exposed here (the sweeper attaches its own).
unsafe impl Send for Ephemeral {}
unsafe impl Sync for Ephemeral {}

impl Ephemeral {
    pub fn new(config: &EphemeralConfig) -> Result<Ephemeral, Error> {
        let (major, minor) = abi_version();
        if major != e::QUEEN_EPHEMERAL_ABI_MAJOR {
            return Err(Error::Version(format!(
                "libqueen_ephemeral implements ABI {major}.{minor}, but these bindings need ABI {}.x",
                e::QUEEN_EPHEMERAL_ABI_MAJOR
            )));
        }
        let mut raw = ptr::null_mut();
        // SAFETY: config is a valid struct with struct_size set by config_init.
        check(unsafe { e::queen_ephemeral_create(&config.0, &mut raw) })?;
        Ok(Ephemeral { raw })
    }

    pub fn declare(&self, queue: &str, options: &QueueOptions) -> Result<(), Error> {
        let mut opts = e::queen_ephemeral_queue_options::default();
        // SAFETY: opts is a valid, writable struct.
        unsafe { e::queen_ephemeral_queue_options_init(&mut opts) };
        let set = |v: Option<i64>, field: &mut i64| {
            if let Some(v) = v {
                *field = v;
            }
        };
        set(options.max_bytes.map(|v| v as i64), &mut opts.max_bytes);
        set(options.max_messages.map(|v| v as i64), &mut opts.max_messages);
        set(options.overflow.map(|v| v.code().into()), &mut opts.overflow);
        set(options.lease_ms.map(i64::from), &mut opts.lease_ms);
        set(options.max_retries.map(i64::from), &mut opts.max_retries);
        set(options.ttl_ms.map(|v| v as i64), &mut opts.ttl_ms);
        let queue = name(queue)?;
        // SAFETY: raw is live; queue and opts are borrowed for the call.
        check(unsafe { e::queen_ephemeral_declare(self.raw, queue.as_ptr(), &opts) })
    }

    /// Append a message; returns its offset in the ring.
    pub fn push(&self, queue: &str, partition: &str, payload: &[u8], now_unix_ms: i64) -> Result<i64, Error> {
        let (queue, partition) = (name(queue)?, name(partition)?);
        let mut offset = -1i64;
        // SAFETY: raw is live; every pointer is valid for the call (payload may be
        // dangling-but-non-null only with len 0, which the engine accepts).
        check(unsafe {
            e::queen_ephemeral_push(
                self.raw,
                queue.as_ptr(),
                partition.as_ptr(),
                payload.as_ptr() as *const c_void,
                payload.len(),
                now_unix_ms,
                &mut offset,
            )
        })?;
        Ok(offset)
    }

    /// Lease the next message for a group; `None` when nothing is visible.
    pub fn pop(
        &self,
        queue: &str,
        partition: &str,
        group: &str,
        lease_ms: u32,
        now_unix_ms: i64,
    ) -> Result<Option<Message>, Error> {
        let (queue, partition, group) = (name(queue)?, name(partition)?, name(group)?);
        let mut raw = e::queen_ephemeral_message {
            struct_size: size_of::<e::queen_ephemeral_message>(),
            offset: 0,
            lease_id: 0,
            attempt: 0,
            lease_expires_unix_ms: 0,
            pushed_unix_ms: 0,
            payload: ptr::null_mut(),
            payload_len: 0,
        };
        // SAFETY: raw is live; names are borrowed for the call; out struct is valid.
        let status = unsafe {
            e::queen_ephemeral_pop(
                self.raw,
                queue.as_ptr(),
                partition.as_ptr(),
                group.as_ptr(),
                lease_ms,
                now_unix_ms,
                &mut raw,
            )
        };
        if status == e::QUEEN_EPHEMERAL_EAGAIN {
            return Ok(None);
        }
        check(status)?;
        let payload = if raw.payload.is_null() || raw.payload_len == 0 {
            Vec::new()
        } else {
            // SAFETY: the library owns payload_len bytes at payload until message_free.
            unsafe { std::slice::from_raw_parts(raw.payload, raw.payload_len).to_vec() }
        };
        // SAFETY: frees the library's copy; the struct stays ours.
        unsafe { e::queen_ephemeral_message_free(&mut raw) };
        Ok(Some(Message {
            offset: raw.offset,
            lease_id: raw.lease_id,
            attempt: raw.attempt,
            lease_expires_unix_ms: raw.lease_expires_unix_ms,
            pushed_unix_ms: raw.pushed_unix_ms,
            payload,
        }))
    }

    /// Settle a delivery (offset -1 finds it by lease_id; lease_id 0 by offset alone).
    #[allow(clippy::too_many_arguments)]
    pub fn ack(
        &self,
        queue: &str,
        partition: &str,
        group: &str,
        offset: i64,
        lease_id: u64,
        outcome: Outcome,
        now_unix_ms: i64,
    ) -> Result<(), Error> {
        let (queue, partition, group) = (name(queue)?, name(partition)?, name(group)?);
        let outcome = match outcome {
            Outcome::Completed => e::QUEEN_EPHEMERAL_ACK_COMPLETED,
            Outcome::Retry => e::QUEEN_EPHEMERAL_ACK_RETRY,
            Outcome::Failed => e::QUEEN_EPHEMERAL_ACK_FAILED,
        };
        // SAFETY: raw is live; names are borrowed for the call.
        check(unsafe {
            e::queen_ephemeral_ack(
                self.raw,
                queue.as_ptr(),
                partition.as_ptr(),
                group.as_ptr(),
                offset,
                lease_id,
                outcome,
                now_unix_ms,
            )
        })
    }

    /// One backstop pass over every queue.
    pub fn sweep(&self, now_unix_ms: i64) -> Result<SweepResult, Error> {
        let mut out = SweepResult { struct_size: size_of::<SweepResult>(), ..Default::default() };
        // SAFETY: raw is live; out is a valid struct with struct_size set.
        check(unsafe { e::queen_ephemeral_sweep(self.raw, now_unix_ms, &mut out) })?;
        Ok(out)
    }

    /// The engine's JSON snapshot.
    pub fn stats(&self) -> Result<String, Error> {
        read_snprintf_with(
            // SAFETY: raw is live; buffer and cap agree.
            |buf: *mut c_char, cap| unsafe { e::queen_ephemeral_stats(self.raw, buf, cap) },
            |status| Error::with_message(status, last_error()),
        )
    }

    /// A queue's shape; `Error::NotFound` if it does not exist.
    pub fn queue_info(&self, queue: &str) -> Result<QueueInfo, Error> {
        let queue = name(queue)?;
        let mut out = QueueInfo { struct_size: size_of::<QueueInfo>(), ..Default::default() };
        // SAFETY: raw is live; out is valid with struct_size set.
        check(unsafe { e::queen_ephemeral_queue_info(self.raw, queue.as_ptr(), &mut out) })?;
        Ok(out)
    }

    /// The backstop provider the engine fills for `queen_sweeper_set_backstop`.
    pub fn backstop_provider(&self) -> Result<sys::queen_sweeper_backstop, Error> {
        let mut provider =
            sys::queen_sweeper_backstop { struct_size: 0, ctx: ptr::null_mut(), sweep: None, attach_waker: None };
        // SAFETY: raw is live; provider is a queen_sweeper_backstop of the given size.
        check(unsafe {
            e::queen_ephemeral_backstop(
                self.raw,
                &mut provider as *mut _ as *mut c_void,
                size_of::<sys::queen_sweeper_backstop>(),
            )
        })?;
        Ok(provider)
    }
}

impl Drop for Ephemeral {
    fn drop(&mut self) {
        // SAFETY: we own raw; no sweeper can still use it (they hold an Arc).
        unsafe { e::queen_ephemeral_destroy(&mut self.raw) };
    }
}

impl Sweeper {
    /// Hand an ephemeral engine to this sweeper as its backstop (before start).
    /// The sweeper keeps the `Arc` until it is destroyed, so the engine outlives its stop.
    pub fn set_ephemeral_backstop(&mut self, engine: Arc<Ephemeral>) -> Result<(), Error> {
        let provider = engine.backstop_provider()?;
        // SAFETY: provider.ctx is the engine, owned by the Arc given as the guard.
        unsafe { self.set_backstop(&provider, Box::new(engine)) }
    }
}
