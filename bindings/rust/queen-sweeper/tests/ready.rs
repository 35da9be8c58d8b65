//! Sweeper.WaitReady and StatusName (ABI 1.1) against the real library and PostgreSQL.
//!
//! Run as tests/sweeper.rs says; database tests fail without QUEEN_TEST_CONNINFO.

use std::time::Duration;

use queen_sweeper::{abi_version, status_name, Config, Error, Sweeper};

fn conninfo() -> String {
    match std::env::var("QUEEN_TEST_CONNINFO") {
        Ok(v) if !v.is_empty() => v,
        _ => panic!("QUEEN_TEST_CONNINFO is not set (database tests never skip)"),
    }
}

#[test]
fn status_name_names_the_codes() {
    assert_eq!(status_name(0), "QUEEN_SWEEPER_OK");
    assert_eq!(status_name(-110), "QUEEN_SWEEPER_ETIMEDOUT");
    assert_eq!(status_name(7), "QUEEN_SWEEPER_UNKNOWN");
    assert!(abi_version() >= (1, 1), "{:?}", abi_version());
}

#[test]
fn wait_ready_after_start_and_refused_otherwise() {
    let cfg = Config::new()
        .conninfo(&conninfo())
        .apply_schema(true)
        .read_env(false)
        .int("sweeper_max_sleep_ms", 200);
    let mut sw = Sweeper::new(&cfg).expect("create");
    match sw.wait_ready(Duration::from_millis(10)) {
        Err(Error::State(m)) => assert!(m.contains("not started"), "{m}"),
        other => panic!("wait_ready before start: {other:?}"),
    }
    sw.start().expect("start");
    sw.wait_ready(Duration::from_secs(60)).expect("ready");
    let stats = sw.stats().expect("stats");
    assert!(stats.contains("\"ready\":true"), "{stats}");
    sw.stop(Duration::from_secs(10)).expect("stop");
    assert!(matches!(sw.wait_ready(Duration::from_millis(10)), Err(Error::State(_))));
}

#[test]
fn wait_ready_times_out_with_the_reason() {
    let cfg = Config::new()
        .conninfo(&format!("{} dbname=queen_no_such_database", conninfo()))
        .read_env(false)
        .boolean("log_stderr", false)
        .int("connect_timeout_ms", 1000);
    let mut sw = Sweeper::new(&cfg).expect("create");
    sw.start().expect("start");
    match sw.wait_ready(Duration::from_millis(1500)) {
        Err(Error::Timeout(m)) => assert!(m.contains("not ready after 1500 ms"), "{m}"),
        other => panic!("wait_ready on a missing database: {other:?}"),
    }
}
