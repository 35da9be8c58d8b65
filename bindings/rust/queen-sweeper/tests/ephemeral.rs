//! Ephemeral.*: the engine through the safe crate (feature `ephemeral`).
//!
//!   cargo test --offline --features queen-sweeper/ephemeral
//! with LD_LIBRARY_PATH holding both <build> and <build>/plugins/ephemeral.
#![cfg(feature = "ephemeral")]

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use queen_sweeper::ephemeral::{Ephemeral, EphemeralConfig, Outcome, QueueOptions};
use queen_sweeper::{Config, Error, Sweeper};

const T0: i64 = 1_700_000_000_000;

/// A number in the engine's JSON stats, found without a parser.
fn number_of(stats: &str, key: &str) -> Option<i64> {
    let at = stats.find(&format!("\"{key}\""))? + key.len() + 2;
    let rest = stats[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

#[test]
fn ephemeral_push_pop_ack() {
    let engine = Ephemeral::new(&EphemeralConfig::new()).unwrap();
    engine.push("q", "p0", b"one", T0).unwrap();
    let second = engine.push("q", "p0", b"two", T0).unwrap();
    let msg = engine.pop("q", "p0", "g", 0, T0).unwrap().expect("a message");
    assert_eq!(msg.payload, b"one");
    assert_eq!(msg.attempt, 1);
    engine.ack("q", "p0", "g", msg.offset, msg.lease_id, Outcome::Completed, T0).unwrap();
    let msg = engine.pop("q", "p0", "g", 0, T0).unwrap().expect("a message");
    assert_eq!((msg.offset, msg.payload.as_slice()), (second, &b"two"[..]));
    engine.ack("q", "p0", "g", msg.offset, msg.lease_id, Outcome::Completed, T0).unwrap();
    assert!(engine.pop("q", "p0", "g", 0, T0).unwrap().is_none());
    assert!(engine.stats().unwrap().contains("\"pushed_total\""));
}

#[test]
fn ephemeral_lease_expiry_and_errors() {
    let engine = Ephemeral::new(&EphemeralConfig::new().lease_ms(1000).queue_max_messages(1)).unwrap();
    engine.push("q", "p0", b"x", T0).unwrap();
    match engine.push("q", "p0", b"y", T0) {
        Err(Error::Full(m)) => assert!(m.contains("queue_max_messages"), "{m}"),
        other => panic!("expected Full, got {other:?}"),
    }
    let msg = engine.pop("q", "p0", "g", 0, T0).unwrap().unwrap();
    assert_eq!(engine.sweep(T0 + 5000).unwrap().redelivered, 1);
    assert_eq!(engine.pop("q", "p0", "g", 0, T0 + 5000).unwrap().unwrap().attempt, msg.attempt + 1);
    assert!(matches!(engine.queue_info("nope"), Err(Error::NotFound(_))));
    engine.declare("d", &QueueOptions { ttl_ms: Some(10), ..Default::default() }).unwrap();
    assert_eq!(engine.queue_info("d").unwrap().declared, 1);
    match Ephemeral::new(&EphemeralConfig::new().lease_ms(0)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("lease_ms"), "{m}"),
        other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
    }
}

/// Offsets survive the collection of an idle queue: a consumer whose lease lapsed and who
/// acks by offset alone must not settle the message a recreated queue pushed since (issue 18).
#[test]
fn ephemeral_late_ack_after_collection_is_refused() {
    let engine = Ephemeral::new(&EphemeralConfig::new().lease_ms(100).idle_gc_ms(1000)).unwrap();
    engine.push("q", "p0", b"first", T0).unwrap();
    let stalled = engine.pop("q", "p0", "g", 0, T0).unwrap().unwrap();
    let again = engine.pop("q", "p0", "g", 0, T0 + 100).unwrap().unwrap();
    engine.ack("q", "p0", "g", again.offset, again.lease_id, Outcome::Completed, T0 + 100).unwrap();
    assert_eq!(engine.sweep(T0 + 1100).unwrap().queues_collected, 1);
    let offset = engine.push("q", "p0", b"second", T0 + 1200).unwrap();
    assert!(offset > stalled.offset, "offset {offset} reused");
    let fresh = engine.pop("q", "p0", "g", 5000, T0 + 1300).unwrap().unwrap();
    match engine.ack("q", "p0", "g", stalled.offset, 0, Outcome::Retry, T0 + 1400) {
        Err(Error::NotFound(_)) => {}
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(engine.pop("q", "p0", "g", 0, T0 + 1500).unwrap().is_none(), "delivered twice");
    engine.ack("q", "p0", "g", fresh.offset, fresh.lease_id, Outcome::Completed, T0 + 1600).unwrap();
}

#[test]
fn ephemeral_backstop_of_a_sweeper() {
    let conninfo = std::env::var("QUEEN_TEST_CONNINFO")
        .expect("QUEEN_TEST_CONNINFO is not set: database tests never skip");
    let engine = Arc::new(Ephemeral::new(&EphemeralConfig::new().lease_ms(100)).unwrap());
    let now = queen_sweeper::ephemeral::now_ms();
    engine.push("bq", "p0", b"x", now).unwrap();
    engine.pop("bq", "p0", "g", 0, now).unwrap().unwrap();
    let mut sw = Sweeper::new(&Config::new().conninfo(&conninfo).apply_schema(true).read_env(false)).unwrap();
    sw.set_ephemeral_backstop(Arc::clone(&engine)).unwrap();
    sw.start().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while number_of(&engine.stats().unwrap(), "redelivered_total").unwrap_or(0) < 1 {
        assert!(Instant::now() < deadline, "the backstop never redelivered: {}", engine.stats().unwrap());
        thread::sleep(Duration::from_millis(50));
    }
    sw.stop(Duration::from_secs(10)).unwrap();
    drop(sw);
    assert_eq!(Arc::strong_count(&engine), 1, "the sweeper released the engine");
}
