//! Sweeper.*: the safe crate against the real library and a real PostgreSQL.
//!
//! Run (from bindings/rust):
//!   QUEEN_SWEEPER_LIB_DIR=<build> LD_LIBRARY_PATH=<build> QUEEN_TEST_CONNINFO=... \
//!     CARGO_TARGET_DIR=/tmp/cargo-target cargo test --offline
//! Database tests fail (never pass silently) without QUEEN_TEST_CONNINFO.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use queen_sweeper::{abi_version, decode_segment, txn_hash, version, Config, Error, Level, Sweeper};

fn conninfo() -> String {
    match std::env::var("QUEEN_TEST_CONNINFO") {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "QUEEN_TEST_CONNINFO is not set: start a database with \
             `eval \"$(tests/pg start $(mktemp -d))\"` (database tests never skip)"
        ),
    }
}

fn config() -> Config {
    Config::new()
        .conninfo(&conninfo())
        .apply_schema(true)
        .read_env(false)
        .int("sweeper_min_sleep_ms", 5)
        .int("sweeper_max_sleep_ms", 200)
}

/// A top-level number of the stats JSON.
fn number_of(stats: &str, key: &str) -> Option<i64> {
    field_of(stats, key)?.parse().ok()
}

/// The raw text of a top-level scalar of the stats JSON, found without a
/// parser: nested objects (the backstop block has its own wakes_total) are skipped.
fn field_of<'a>(stats: &'a str, key: &str) -> Option<&'a str> {
    let bytes = stats.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                let rest = stats[i + 1..].trim_start();
                if depth == 1 && &stats[start..i] == key && rest.starts_with(':') {
                    let rest = rest[1..].trim_start();
                    let end = rest.find([',', '}', ' ', '\n']).unwrap_or(rest.len());
                    return Some(&rest[..end]);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Every test that starts a sweeper ends here: stop succeeds twice, the loop
/// closed cleanly (uv_loop_close returned 0), drop destroys.
fn clean_teardown(mut sw: Sweeper) {
    sw.stop(Duration::from_secs(10)).expect("stop");
    let stats = sw.stats().expect("stats after stop");
    assert_eq!(field_of(&stats, "state"), Some("\"stopped\""), "{stats}");
    assert_eq!(field_of(&stats, "teardown_clean"), Some("true"), "{stats}");
    sw.stop(Duration::from_secs(10)).expect("stop is idempotent");
    drop(sw);
}

fn invalid_message(config: Config) -> String {
    match Sweeper::new(&config) {
        Err(Error::InvalidArgument(message)) => message,
        Err(other) => panic!("expected InvalidArgument, got {other:?}"),
        Ok(_) => panic!("a bad configuration was accepted: {}", config.to_json()),
    }
}

#[test]
fn version_major_is_one() {
    let (major, minor) = abi_version();
    assert_eq!(major, 1);
    let packed = unsafe { queen_sweeper::sys::queen_sweeper_abi_version() };
    assert_eq!(packed, (major << 16) | minor);
    assert!(!version().is_empty());
    queen_sweeper::check_abi().expect("the loaded library is ABI 1");
}

#[test]
fn version_get_api_refuses_other_majors() {
    // SAFETY: plain calls; the table is static.
    let table = unsafe { queen_sweeper::sys::queen_sweeper_get_api(1) };
    assert!(!table.is_null());
    let table = unsafe { &*table };
    assert!(table.struct_size >= std::mem::size_of::<queen_sweeper::sys::queen_sweeper_api>());
    assert_eq!(table.abi_major, 1);
    assert!(unsafe { queen_sweeper::sys::queen_sweeper_get_api(2) }.is_null());
    let message = queen_sweeper::last_error();
    assert!(message.contains('2') && message.contains('1'), "{message}");
}

#[test]
fn config_unknown_key_is_named() {
    let message = invalid_message(Config::new().read_env(false).int("sweeper_min_sleep_mss", 5));
    assert!(message.contains("sweeper_min_sleep_mss"), "{message}");
}

#[test]
fn config_wrong_type_is_named() {
    let message = invalid_message(Config::new().read_env(false).string("sweeper_min_sleep_ms", "fast"));
    assert!(message.contains("sweeper_min_sleep_ms"), "{message}");
}

#[test]
fn config_out_of_range_is_named() {
    let message = invalid_message(Config::new().read_env(false).int("sweeper_parallelism", 9));
    assert!(message.contains("sweeper_parallelism"), "{message}");
}

#[test]
fn config_malformed_boolean_is_named() {
    let message = invalid_message(Config::new().read_env(false).string("apply_schema", "maybe"));
    assert!(message.contains("apply_schema"), "{message}");
}

#[test]
fn config_invalid_json_is_refused() {
    match Sweeper::from_json("{not json") {
        Err(e @ Error::InvalidArgument(_)) => {
            assert!(!e.message().is_empty());
            assert_eq!(e.code(), -22);
            assert!(e.to_string().contains("invalid argument"));
        }
        other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn lifecycle_start_stop_drop() {
    let mut sw = Sweeper::new(&config()).expect("create");
    sw.start().expect("start");
    assert!(sw.is_started());
    match sw.start() {
        Err(Error::State(_)) => {}
        other => panic!("a second start must be a State error, got {other:?}"),
    }
    match sw.on_log(|_, _| {}) {
        Err(Error::State(_)) => {}
        other => panic!("a setter after start must be a State error, got {other:?}"),
    }
    clean_teardown(sw);
}

#[test]
fn lifecycle_stop_before_start_and_drop_without_stop() {
    let mut sw = Sweeper::new(&config()).expect("create");
    sw.stop(Duration::from_secs(1)).expect("stop before start is OK");
    drop(sw);
    let mut sw = Sweeper::new(&config()).expect("create");
    sw.start().expect("start");
    drop(sw); // Drop stops and destroys
}

#[test]
fn lifecycle_moves_to_another_thread() {
    let mut sw = Sweeper::new(&config()).expect("create");
    sw.start().expect("start");
    let sw = Arc::new(sw);
    let waker = {
        let sw = Arc::clone(&sw);
        thread::spawn(move || {
            for i in 0..100 {
                sw.wake(i as i64);
            }
        })
    };
    waker.join().unwrap();
    let sw = Arc::try_unwrap(sw).ok().expect("sole owner again");
    thread::spawn(move || clean_teardown(sw)).join().unwrap();
}

#[test]
fn wake_with_millis_and_system_time() {
    let mut sw = Sweeper::new(&config()).expect("create");
    sw.start().expect("start");
    let before = number_of(&sw.stats().unwrap(), "wakes_total").expect("wakes_total");
    sw.wake(SystemTime::now());
    sw.wake(SystemTime::now() - Duration::from_secs(3600));
    sw.wake(0i64);
    wait_until("wakes_total to count three calls", Duration::from_secs(5), || {
        number_of(&sw.stats().unwrap(), "wakes_total").unwrap() >= before + 3
    });
    let stats = sw.stats().unwrap();
    let signals = number_of(&stats, "wake_signals_total").expect("wake_signals_total");
    assert!(signals >= 1 && signals <= number_of(&stats, "wakes_total").unwrap(), "{stats}");
    clean_teardown(sw);
}

#[test]
fn stats_and_metrics_carry_the_contract() {
    let mut sw = Sweeper::new(&config()).expect("create");
    sw.start().expect("start");
    let stats = sw.stats().unwrap();
    assert!(stats.trim_start().starts_with('{') && stats.trim_end().ends_with('}'), "{stats}");
    for key in ["\"state\"", "\"cycles_total\"", "\"fired_total\"", "\"wakes_total\"", "\"wake_signals_total\""] {
        assert!(stats.contains(key), "{key} missing from {stats}");
    }
    let metrics = sw.metrics().unwrap();
    assert!(metrics.lines().any(|l| l.starts_with("queen_")), "{metrics}");
    clean_teardown(sw);
}

#[test]
fn callbacks_deliver_and_panics_are_contained() {
    let seen = Arc::new(AtomicUsize::new(0));
    let lines = Arc::new(Mutex::new(Vec::<(Level, String)>::new()));
    let mut sw = Sweeper::new(&config().log_level("debug")).expect("create");
    {
        let seen = Arc::clone(&seen);
        let lines = Arc::clone(&lines);
        sw.on_log(move |level, message| {
            seen.fetch_add(1, Ordering::SeqCst);
            lines.lock().unwrap().push((level, message.to_owned()));
            panic!("boom from the log callback");
        })
        .expect("on_log");
    }
    sw.on_fired(|_| panic!("boom from the fired callback")).expect("on_fired");
    sw.start().expect("start");
    wait_until("a log message", Duration::from_secs(10), || seen.load(Ordering::SeqCst) > 0);
    assert!(sw.stats().unwrap().contains("\"state\""));
    clean_teardown(sw);
    assert!(lines.lock().unwrap().iter().all(|(_, m)| !m.is_empty()));
}

#[test]
fn decode_garbage_is_corrupt() {
    match decode_segment(b"this is not a zstd segment at all") {
        Err(e @ Error::Corrupt(_)) => assert!(!e.message().is_empty()),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    match decode_segment(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Err(Error::Corrupt(_)) => {}
        other => panic!("expected Corrupt for a truncated blob, got {other:?}"),
    }
    assert!(decode_segment(&[]).is_err());
}

#[test]
fn txn_hash_is_xxh3_128_big_endian() {
    let empty = txn_hash(b"");
    let hex: String = empty.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "99aa06d3014798d86001c324468d497f");
    assert_eq!(txn_hash(b"t1"), txn_hash(b"t1"));
    assert_ne!(txn_hash(b"t1"), txn_hash(b"t2"));
}
