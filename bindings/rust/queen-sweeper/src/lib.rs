//! Safe bindings of `libqueen_sweeper.so` (ABI v1): the background timer
//! sweeper of a PostgreSQL-backed broker.
//!
//! ```no_run
//! use queen_sweeper::{Config, Sweeper};
//! use std::time::{Duration, SystemTime};
//!
//! let config = Config::new()
//!     .conninfo("host=127.0.0.1 dbname=broker")
//!     .apply_schema(true)
//!     .int("sweeper_min_sleep_ms", 5);
//! let mut sweeper = Sweeper::new(&config)?;
//! sweeper.on_fired(|fired| println!("{} messages on {}/{}", fired.count, fired.queue, fired.partition))?;
//! sweeper.start()?;
//! // after every commit that scheduled a timer:
//! sweeper.wake(SystemTime::now());
//! println!("{}", sweeper.stats()?);
//! sweeper.stop(Duration::from_secs(5))?;
//! # Ok::<(), queen_sweeper::Error>(())
//! ```

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use queen_sweeper_sys as sys;

#[cfg(feature = "ephemeral")]
pub mod ephemeral;

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// A failing call, carrying the library's own last-error text.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// EINVAL: a bad argument or configuration; the message names the key.
    InvalidArgument(String),
    /// ESTATE: not valid in the sweeper's current state (a setter after start, a second start).
    State(String),
    /// ETIMEDOUT: stop overran its timeout (the sweeper is still fully stopped and joined).
    Timeout(String),
    /// ECORRUPT: a segment blob is corrupt or truncated.
    Corrupt(String),
    /// EVERSION, or a loaded library whose ABI major differs from these bindings'.
    Version(String),
    /// EINTERNAL, ENOMEM, or any status these bindings do not know.
    Internal(String),
    /// ENOENT (ephemeral engine only): no such queue, partition, group or open delivery.
    NotFound(String),
    /// EFULL (ephemeral engine only): a bound rejected the call; the message names it.
    Full(String),
    /// ESTALE (ephemeral engine only): the lease was superseded by a later delivery.
    Stale(String),
}

impl Error {
    /// The error for a negative status, with the calling thread's last error.
    fn from_status(status: i64) -> Error {
        Error::with_message(status, last_error())
    }

    pub(crate) fn with_message(status: i64, message: String) -> Error {
        match status as c_int {
            sys::QUEEN_SWEEPER_EINVAL => Error::InvalidArgument(message),
            sys::QUEEN_SWEEPER_ESTATE => Error::State(message),
            sys::QUEEN_SWEEPER_ETIMEDOUT => Error::Timeout(message),
            sys::QUEEN_SWEEPER_ECORRUPT => Error::Corrupt(message),
            sys::QUEEN_SWEEPER_EVERSION => Error::Version(message),
            sys::QUEEN_SWEEPER_ENOMEM => Error::Internal(format!("out of memory: {message}")),
            -2 => Error::NotFound(message),
            -28 => Error::Full(message),
            -116 => Error::Stale(message),
            _ => Error::Internal(format!("status {status}: {message}")),
        }
    }

    /// The library's message.
    pub fn message(&self) -> &str {
        match self {
            Error::InvalidArgument(m)
            | Error::State(m)
            | Error::Timeout(m)
            | Error::Corrupt(m)
            | Error::Version(m)
            | Error::Internal(m)
            | Error::NotFound(m)
            | Error::Full(m)
            | Error::Stale(m) => m,
        }
    }

    /// The C status this error stands for.
    pub fn code(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => sys::QUEEN_SWEEPER_EINVAL,
            Error::State(_) => sys::QUEEN_SWEEPER_ESTATE,
            Error::Timeout(_) => sys::QUEEN_SWEEPER_ETIMEDOUT,
            Error::Corrupt(_) => sys::QUEEN_SWEEPER_ECORRUPT,
            Error::Version(_) => sys::QUEEN_SWEEPER_EVERSION,
            Error::Internal(_) => sys::QUEEN_SWEEPER_EINTERNAL,
            Error::NotFound(_) => -2,
            Error::Full(_) => -28,
            Error::Stale(_) => -116,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Error::InvalidArgument(_) => "invalid argument",
            Error::State(_) => "invalid state",
            Error::Timeout(_) => "timed out",
            Error::Corrupt(_) => "corrupt segment",
            Error::Version(_) => "ABI version mismatch",
            Error::Internal(_) => "internal error",
            Error::NotFound(_) => "not found",
            Error::Full(_) => "full",
            Error::Stale(_) => "stale lease",
        };
        write!(f, "queen_sweeper: {kind}: {}", self.message())
    }
}

impl std::error::Error for Error {}

fn check(status: c_int) -> Result<(), Error> {
    if status < 0 {
        Err(Error::from_status(status as i64))
    } else {
        Ok(())
    }
}

/// The calling thread's last error text ("" when there is none).
pub fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string it owns, never NULL,
    // valid until the next failing call on this thread; copied at once.
    unsafe { text(sys::queen_sweeper_last_error()) }
}

/// Copy a borrowed C string (NULL reads as "").
pub(crate) unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

// ---------------------------------------------------------------------------
// Version
// ---------------------------------------------------------------------------

/// (major, minor) of the loaded library.
pub fn abi_version() -> (u32, u32) {
    // SAFETY: no arguments; never fails.
    let packed = unsafe { sys::queen_sweeper_abi_version() };
    (packed >> 16, packed & 0xFFFF)
}

/// The library's release version, such as "1.1.0".
pub fn version() -> String {
    // SAFETY: a static string owned by the library.
    unsafe { text(sys::queen_sweeper_version()) }
}

/// The symbolic name of a status code, such as "QUEEN_SWEEPER_ETIMEDOUT"
/// ("QUEEN_SWEEPER_UNKNOWN" for a value the library does not define).
pub fn status_name(status: i32) -> String {
    // SAFETY: a static string owned by the library, never NULL.
    unsafe { text(sys::queen_sweeper_status_name(status)) }
}

/// Refuse a library of another ABI major, naming both versions.
pub fn check_abi() -> Result<(), Error> {
    let (major, minor) = abi_version();
    if major != sys::QUEEN_SWEEPER_ABI_MAJOR {
        return Err(Error::Version(format!(
            "libqueen_sweeper implements ABI {major}.{minor}, but these bindings need ABI {}.x (built against {}.{})",
            sys::QUEEN_SWEEPER_ABI_MAJOR,
            sys::QUEEN_SWEEPER_ABI_MAJOR,
            sys::QUEEN_SWEEPER_ABI_MINOR
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// One configuration value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::Int(v.into())
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(v.into())
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}

/// The JSON configuration object handed to `queen_sweeper_create`, built by
/// hand. Keys are the knob names in lower case (`sweeper_min_sleep_ms`,
/// `kv_expire_batch`, ...) plus `conninfo`, `broker_id`, `pool_size`,
/// `apply_schema`, `read_env`, `log_level`. The library validates every key:
/// a typo is an `Error::InvalidArgument` naming it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    entries: Vec<(String, Value)>,
}

impl Config {
    pub fn new() -> Self {
        Config::default()
    }

    /// Set any key; a later set of the same key replaces the earlier one.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        let value = value.into();
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key.to_owned(), value)),
        }
        self
    }

    pub fn int(self, key: &str, value: i64) -> Self {
        self.set(key, Value::Int(value))
    }
    pub fn boolean(self, key: &str, value: bool) -> Self {
        self.set(key, Value::Bool(value))
    }
    pub fn string(self, key: &str, value: &str) -> Self {
        self.set(key, Value::Str(value.to_owned()))
    }
    pub fn conninfo(self, conninfo: &str) -> Self {
        self.string("conninfo", conninfo)
    }
    pub fn broker_id(self, broker_id: &str) -> Self {
        self.string("broker_id", broker_id)
    }
    pub fn apply_schema(self, on: bool) -> Self {
        self.boolean("apply_schema", on)
    }
    pub fn read_env(self, on: bool) -> Self {
        self.boolean("read_env", on)
    }
    pub fn log_level(self, level: &str) -> Self {
        self.string("log_level", level)
    }

    /// The JSON text, in insertion order.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (i, (key, value)) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            json_string(&mut out, key);
            out.push(':');
            match value {
                Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                Value::Int(n) => out.push_str(&n.to_string()),
                // JSON has no NaN or infinity: null lets the library name the key.
                Value::Float(x) if x.is_finite() => out.push_str(&format!("{x:?}")),
                Value::Float(_) => out.push_str("null"),
                Value::Str(s) => json_string(&mut out, s),
            }
        }
        out.push('}');
        out
    }
}

fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------
// Callbacks
// ---------------------------------------------------------------------------

/// One fired segment, as passed to the `on_fired` callback.
#[derive(Debug, Clone, Copy)]
pub struct Fired<'a> {
    /// The tenant uuid in text form.
    pub tenant: &'a str,
    pub queue: &'a str,
    pub partition: &'a str,
    /// Messages appended.
    pub count: u32,
    /// Log offset of the first of them.
    pub base_offset: i64,
}

/// Log levels as passed to `on_log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    fn from_c(level: c_int) -> Level {
        match level {
            sys::QUEEN_SWEEPER_LOG_ERROR => Level::Error,
            sys::QUEEN_SWEEPER_LOG_WARN => Level::Warn,
            sys::QUEEN_SWEEPER_LOG_INFO => Level::Info,
            _ => Level::Debug,
        }
    }
}

type LogFn = dyn FnMut(Level, &str) + Send + 'static;
type FiredFn = dyn for<'a> FnMut(Fired<'a>) + Send + 'static;

// The log callback may run on the sweeper's thread and, for start/stop
// messages, on the caller's thread at the same time; the Mutex makes the
// FnMut exclusive. A panic is caught here: unwinding into C is undefined.
struct Slot<F: ?Sized>(Mutex<Box<F>>);

thread_local! {
    // Set while a callback of this crate runs, so Drop can refuse to destroy
    // a sweeper from its own thread (which the header forbids).
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

fn guarded(what: &str, f: impl FnOnce()) {
    let was = IN_CALLBACK.with(|c| c.replace(true));
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        // The panic message itself was already printed by the panic hook.
        eprintln!("queen_sweeper: a panic in the {what} callback was caught at the FFI boundary");
    }
    IN_CALLBACK.with(|c| c.set(was));
}

unsafe extern "C" fn log_trampoline(user: *mut c_void, level: c_int, message: *const c_char) {
    // SAFETY: `user` is the Slot<LogFn> the owner keeps alive until after destroy.
    let slot = &*(user as *const Slot<LogFn>);
    let message = text(message);
    guarded("log", || {
        let mut f = slot.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(Level::from_c(level), &message);
    });
}

unsafe extern "C" fn fired_trampoline(
    user: *mut c_void,
    tenant: *const c_char,
    queue: *const c_char,
    partition: *const c_char,
    count: u32,
    base_offset: i64,
) {
    // SAFETY: `user` is the Slot<FiredFn> the owner keeps alive until after destroy;
    // the strings are valid for the duration of the call.
    let slot = &*(user as *const Slot<FiredFn>);
    let (tenant, queue, partition) = (text(tenant), text(queue), text(partition));
    guarded("fired", || {
        let mut f = slot.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(Fired { tenant: &tenant, queue: &queue, partition: &partition, count, base_offset });
    });
}

// ---------------------------------------------------------------------------
// The owner
// ---------------------------------------------------------------------------

/// An instant for `Sweeper::wake`: unix milliseconds or a `SystemTime`.
pub trait WakeInstant {
    fn unix_ms(self) -> i64;
}

impl WakeInstant for i64 {
    fn unix_ms(self) -> i64 {
        self
    }
}

impl WakeInstant for SystemTime {
    fn unix_ms(self) -> i64 {
        match self.duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// One sweeper. Dropping it stops it (5 s) and destroys the handle.
pub struct Sweeper {
    raw: *mut sys::queen_sweeper,
    started: bool,
    // Boxed so their addresses, handed to C as `user`, never move; dropped
    // only after queen_sweeper_destroy has joined the thread that calls them.
    log: Option<Box<Slot<LogFn>>>,
    fired: Option<Box<Slot<FiredFn>>>,
    backstop_guard: Option<Box<dyn std::any::Any + Send>>,
}

// SAFETY (Send): the header ties a sweeper to no thread. queen_sweeper_create
// is "any thread"; stop is "any thread except the sweeper's own callbacks";
// destroy, start and the setters only forbid *concurrent* calls on the same
// sweeper, which moving the owner between threads cannot create. The stored
// callbacks are `Send` by their bounds, and the backstop guard is `Send`.
unsafe impl Send for Sweeper {}

// SAFETY (Sync): every method taking `&self` (wake, wait_ready, stats, metrics,
// is_started) calls only functions the header documents as "any thread,
// concurrently with everything but destroy"; destroy needs ownership (Drop),
// and everything else (start, stop, the setters) takes `&mut self`, so the
// borrow checker already keeps it exclusive.
unsafe impl Sync for Sweeper {}

impl Sweeper {
    /// Create a sweeper from a configuration (a bad key is `InvalidArgument` naming it).
    pub fn new(config: &Config) -> Result<Sweeper, Error> {
        Sweeper::from_json(&config.to_json())
    }

    /// Create a sweeper from raw JSON text.
    pub fn from_json(json: &str) -> Result<Sweeper, Error> {
        check_abi()?;
        let c_json = CString::new(json)
            .map_err(|_| Error::InvalidArgument("the configuration contains a NUL byte".into()))?;
        let mut raw = ptr::null_mut();
        // SAFETY: c_json lives for the call; raw is a valid out pointer.
        check(unsafe { sys::queen_sweeper_create(c_json.as_ptr(), &mut raw) })?;
        Ok(Sweeper { raw, started: false, log: None, fired: None, backstop_guard: None })
    }

    /// Set the log callback (before start).
    pub fn on_log<F>(&mut self, f: F) -> Result<(), Error>
    where
        F: FnMut(Level, &str) + Send + 'static,
    {
        let slot: Box<Slot<LogFn>> = Box::new(Slot(Mutex::new(Box::new(f))));
        let user = &*slot as *const Slot<LogFn> as *mut c_void;
        // SAFETY: raw is live; slot outlives the handle (kept in self, dropped after destroy).
        check(unsafe { sys::queen_sweeper_set_log_callback(self.raw, Some(log_trampoline), user) })?;
        self.log = Some(slot);
        Ok(())
    }

    /// Set the callback run after every fire commit, once per fired segment (before start).
    pub fn on_fired<F>(&mut self, f: F) -> Result<(), Error>
    where
        F: for<'a> FnMut(Fired<'a>) + Send + 'static,
    {
        let slot: Box<Slot<FiredFn>> = Box::new(Slot(Mutex::new(Box::new(f))));
        let user = &*slot as *const Slot<FiredFn> as *mut c_void;
        // SAFETY: as in on_log.
        check(unsafe { sys::queen_sweeper_set_fired_callback(self.raw, Some(fired_trampoline), user) })?;
        self.fired = Some(slot);
        Ok(())
    }

    /// Remove both callbacks (before start).
    pub fn clear_callbacks(&mut self) -> Result<(), Error> {
        // SAFETY: raw is live; NULL functions remove the callbacks.
        check(unsafe { sys::queen_sweeper_set_log_callback(self.raw, None, ptr::null_mut()) })?;
        check(unsafe { sys::queen_sweeper_set_fired_callback(self.raw, None, ptr::null_mut()) })?;
        self.log = None;
        self.fired = None;
        Ok(())
    }

    /// Hand a backstop provider to the sweeper (before start). `guard` is kept
    /// by the sweeper and dropped only after its handle is destroyed: put in it
    /// whatever owns `provider.ctx` (for instance the ephemeral engine).
    ///
    /// # Safety
    /// `provider` must be a valid provider whose `ctx` stays valid, and whose
    /// functions stay callable, until the sweeper is stopped; owning the ctx
    /// through `guard` guarantees that.
    pub unsafe fn set_backstop(
        &mut self,
        provider: &sys::queen_sweeper_backstop,
        guard: Box<dyn std::any::Any + Send>,
    ) -> Result<(), Error> {
        check(sys::queen_sweeper_set_backstop(self.raw, provider))?;
        self.backstop_guard = Some(guard);
        Ok(())
    }

    /// Spawn the loop thread; a database that is down is not a failure.
    pub fn start(&mut self) -> Result<(), Error> {
        // SAFETY: raw is live; &mut self excludes concurrent stop/destroy.
        check(unsafe { sys::queen_sweeper_start(self.raw) })?;
        self.started = true;
        Ok(())
    }

    /// Stop gracefully within `timeout` (capped at u32::MAX ms). Idempotent.
    /// `Error::Timeout` still means stopped and joined.
    pub fn stop(&mut self, timeout: Duration) -> Result<(), Error> {
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        // SAFETY: raw is live; stop from a callback is impossible without &mut self.
        check(unsafe { sys::queen_sweeper_stop(self.raw, ms) })
    }

    /// Ring the sweeper for a timer due at `at` (call it after the scheduling commit).
    /// Never fails, never blocks.
    pub fn wake(&self, at: impl WakeInstant) {
        // SAFETY: raw is live for &self; wake is lock-free and any-thread.
        unsafe { sys::queen_sweeper_wake(self.raw, at.unix_ms()) }
    }

    /// Block until the sweeper is ready: its schema step succeeded (the apply, or
    /// the version check) and a first probe completed. `Error::Timeout` carries the
    /// reason it is not ready yet (a failed schema apply, a database it cannot reach);
    /// `Error::State` means not started, disabled by configuration, or stopped.
    pub fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        // SAFETY: raw is live for &self; wait_ready is any-thread, concurrently with
        // everything but destroy, which needs ownership.
        check(unsafe { sys::queen_sweeper_wait_ready(self.raw, ms) })
    }

    /// The JSON snapshot (parsing it is the caller's).
    pub fn stats(&self) -> Result<String, Error> {
        // SAFETY: raw is live; the buffer pointer and cap agree.
        read_snprintf(|buf, cap| unsafe { sys::queen_sweeper_stats(self.raw, buf, cap) })
    }

    /// The same figures as Prometheus text exposition.
    pub fn metrics(&self) -> Result<String, Error> {
        // SAFETY: as in stats.
        read_snprintf(|buf, cap| unsafe { sys::queen_sweeper_metrics(self.raw, buf, cap) })
    }

    /// Whether start() succeeded on this owner.
    pub fn is_started(&self) -> bool {
        self.started
    }

    /// The raw handle, for calls these bindings do not wrap. Still owned by `self`.
    pub fn as_raw(&self) -> *mut sys::queen_sweeper {
        self.raw
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        if IN_CALLBACK.with(|c| c.get()) {
            // Destroying from a callback would join the thread we are on. Leak
            // instead, and keep what C may still call alive with it.
            eprintln!("queen_sweeper: a Sweeper dropped inside one of its callbacks is leaked, not destroyed");
            std::mem::forget(self.log.take());
            std::mem::forget(self.fired.take());
            std::mem::forget(self.backstop_guard.take());
            return;
        }
        // SAFETY: we own raw; destroy stops (5 s), joins and clears it. The
        // callback slots and the backstop guard drop after this, once no
        // thread can call them any more.
        unsafe { sys::queen_sweeper_destroy(&mut self.raw) };
    }
}

fn read_snprintf(call: impl FnMut(*mut c_char, usize) -> i64) -> Result<String, Error> {
    read_snprintf_with(call, Error::from_status)
}

/// snprintf semantics: retry with a larger buffer until the text fits.
pub(crate) fn read_snprintf_with(
    mut call: impl FnMut(*mut c_char, usize) -> i64,
    error: impl Fn(i64) -> Error,
) -> Result<String, Error> {
    let mut cap = 4096usize;
    loop {
        let mut buf = vec![0u8; cap];
        let needed = call(buf.as_mut_ptr() as *mut c_char, cap);
        if needed < 0 {
            return Err(error(needed));
        }
        let needed = needed as usize;
        if needed < cap {
            buf.truncate(needed);
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        // The text may grow between two calls; leave some room.
        cap = needed + 1 + needed / 8;
    }
}

// ---------------------------------------------------------------------------
// Segment codec
// ---------------------------------------------------------------------------

/// One message of a packed segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub flags: u8,
    /// The message uuid's 16 bytes.
    pub message_id: [u8; 16],
    /// Present when `flags & 1`.
    pub trace_id: Option<[u8; 16]>,
    pub txn: String,
    /// Present when `flags & 2`.
    pub producer_sub: Option<String>,
    pub encrypted: bool,
    pub payload: Vec<u8>,
}

unsafe fn bytes_at(p: *const u8, len: usize) -> Vec<u8> {
    if len == 0 || p.is_null() {
        Vec::new()
    } else {
        std::slice::from_raw_parts(p, len).to_vec()
    }
}

struct SegmentGuard(*mut sys::queen_sweeper_segment);

impl Drop for SegmentGuard {
    fn drop(&mut self) {
        // SAFETY: we own the decoded segment; free is NULL-safe and clears it.
        unsafe { sys::queen_sweeper_segment_free(&mut self.0) }
    }
}

/// Decode a `queen.log_segments.blob` into its frames; `Error::Corrupt` on a bad blob.
pub fn decode_segment(blob: &[u8]) -> Result<Vec<Frame>, Error> {
    let mut seg = SegmentGuard(ptr::null_mut());
    // A non-null pointer even for an empty slice, so "empty" is judged by the codec.
    let data = if blob.is_empty() { [0u8; 1].as_ptr() } else { blob.as_ptr() };
    // SAFETY: data/len describe readable memory for the call; seg.0 is an out pointer.
    check(unsafe { sys::queen_sweeper_segment_decode(data, blob.len(), &mut seg.0) })?;
    // SAFETY: seg.0 is a live decoded segment.
    let count = unsafe { sys::queen_sweeper_segment_count(seg.0) };
    let mut frames = Vec::with_capacity(count);
    for index in 0..count {
        // SAFETY: an all-zero frame is valid (null pointers, zero lengths).
        let mut raw: sys::queen_sweeper_frame = unsafe { std::mem::zeroed() };
        raw.struct_size = std::mem::size_of::<sys::queen_sweeper_frame>();
        // SAFETY: seg.0 is live and index < count; raw is a valid out struct.
        check(unsafe { sys::queen_sweeper_segment_frame(seg.0, index, &mut raw) })?;
        // SAFETY: the pointers are valid for their lengths while seg lives; copied now.
        let frame = unsafe {
            Frame {
                flags: raw.flags,
                message_id: raw.message_id,
                trace_id: (raw.flags & sys::QUEEN_SWEEPER_FRAME_TRACE_ID != 0).then_some(raw.trace_id),
                txn: String::from_utf8_lossy(&bytes_at(raw.txn as *const u8, raw.txn_len)).into_owned(),
                producer_sub: (raw.flags & sys::QUEEN_SWEEPER_FRAME_PRODUCER_SUB != 0).then(|| {
                    String::from_utf8_lossy(&bytes_at(raw.producer_sub as *const u8, raw.producer_sub_len))
                        .into_owned()
                }),
                encrypted: raw.flags & sys::QUEEN_SWEEPER_FRAME_ENCRYPTED != 0,
                payload: bytes_at(raw.payload, raw.payload_len),
            }
        };
        frames.push(frame);
    }
    Ok(frames)
}

/// xxh3-128 of the txn bytes, big-endian, as stored in `queen.log_txns.hashes`.
pub fn txn_hash(txn: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let data = if txn.is_empty() { [0u8; 1].as_ptr() } else { txn.as_ptr() };
    // SAFETY: data/len readable for the call; out has 16 bytes. The only failures
    // are NULL arguments, which cannot happen here.
    let status = unsafe { sys::queen_sweeper_txn_hash(data as *const c_char, txn.len(), out.as_mut_ptr()) };
    debug_assert_eq!(status, 0, "txn_hash: {}", last_error());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_serializes_json_by_hand() {
        let c = Config::new()
            .conninfo("host=h \"q\"\\\n")
            .apply_schema(true)
            .int("sweeper_min_sleep_ms", 5)
            .set("x", 1.5)
            .int("sweeper_min_sleep_ms", 6);
        assert_eq!(
            c.to_json(),
            r#"{"conninfo":"host=h \"q\"\\\n","apply_schema":true,"sweeper_min_sleep_ms":6,"x":1.5}"#
        );
        assert_eq!(Config::new().to_json(), "{}");
        assert_eq!(Config::new().string("k", "\u{1}").to_json(), r#"{"k":"\u0001"}"#);
    }

    #[test]
    fn system_time_to_unix_ms() {
        assert_eq!((UNIX_EPOCH + Duration::from_millis(1234)).unix_ms(), 1234);
        assert_eq!((UNIX_EPOCH - Duration::from_millis(5)).unix_ms(), -5);
        assert_eq!(42i64.unix_ms(), 42);
    }
}
