//! example-rust-host: drives libqueen_sweeper.so through the safe `queen-sweeper` crate.
//!
//!     QUEEN_SWEEPER_LIB_DIR=build LD_LIBRARY_PATH=build \
//!         cargo run --offline --manifest-path examples/rust_host/Cargo.toml [CONNINFO]
//!
//! CONNINFO defaults to $QUEEN_TEST_CONNINFO, else the PG* environment;
//! $EXAMPLE_TIMERS sets how many timers to schedule (default 20).
//!
//! The host's own connection is libpq through src/pq.rs (no crates). It shows the
//! post-commit wake, that a rolled-back transaction rings nothing, every fired segment
//! (from on_fired, then read back with log_read_v1 and decoded), and exits 0 only if
//! every scheduled timer fired exactly once.

mod pq;

use queen_sweeper::{decode_segment, Config, Sweeper};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TENANT: &str = "00000000-0000-0000-0000-000000000001";
const QUEUE: &str = "example-rust";
const PARTITIONS: usize = 3;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A top-level integer of the stats JSON (the keys used here are unique).
fn stat_int(json: &str, key: &str) -> i64 {
    let pat = format!("\"{key}\":");
    json.find(&pat)
        .map(|at| {
            let rest = &json[at + pat.len()..];
            let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(rest.len());
            rest[..end].parse().unwrap_or(-1)
        })
        .unwrap_or(-1)
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(T[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Schedules timers "<tag>-<i>" in the open transaction; returns txn -> deliverAtMs.
fn schedule(db: &pq::Conn, tag: &str, count: usize, base_delay_ms: i64, spread_ms: i64)
            -> Result<HashMap<String, i64>, String> {
    let mut deliver = HashMap::new();
    for start in (0..count).step_by(256) {
        let end = (start + 256).min(count);
        let mut ops = Vec::new();
        for i in start..end {
            let delay = base_delay_ms + if count > 1 { spread_ms * i as i64 / (count as i64 - 1) } else { 0 };
            // Keys and txns are plain ASCII here, so no JSON escaping is needed.
            ops.push(format!(
                "{{\"op\":\"schedule\",\"queue\":\"{QUEUE}\",\"timerKey\":\"{tag}-{i}\",\"partition\":\"p{}\",\
                 \"delayMs\":{delay},\"txn\":\"{tag}-{i}\",\"payload\":\"{}\"}}",
                i % PARTITIONS,
                base64(format!("{{\"n\":{i}}}").as_bytes())
            ));
        }
        let json = format!("[{}]", ops.join(","));
        // SQL unpacks the index-aligned JSON answer, so this host needs no JSON parser.
        let rows = db.query(
            "SELECT r->>'status', (r->>'deliverAtMs')::bigint \
               FROM jsonb_array_elements(queen.log_timers_apply_v1($1::jsonb, $2::uuid, NULL, now())) \
                    WITH ORDINALITY AS a(r, i) ORDER BY i",
            &[&json, TENANT],
        )?;
        for (k, row) in rows.iter().enumerate() {
            let status = row[0].clone().unwrap_or_default();
            if status != "scheduled" {
                return Err(format!("{tag}-{}: {status}", start + k));
            }
            let at: i64 = row[1].as_deref().unwrap_or("0").parse().unwrap_or(0);
            deliver.insert(format!("{tag}-{}", start + k), at);
        }
    }
    Ok(deliver)
}

struct FiredRec {
    tenant: String,
    partition: String,
    base_offset: i64,
    seen_ms: i64,
}

fn run() -> Result<bool, String> {
    let conninfo = std::env::args().nth(1).or_else(|| std::env::var("QUEEN_TEST_CONNINFO").ok()).unwrap_or_default();
    let n: usize = std::env::var("EXAMPLE_TIMERS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let db = pq::Conn::connect(&conninfo, "example-rust-host")?;

    let fired: Arc<Mutex<(Vec<FiredRec>, u64)>> = Arc::new(Mutex::new((Vec::new(), 0)));
    // The sweeper may connect as a role of its own holding only the queen_sweeper group
    // role (sql/007_roles.sql): QUEEN_EXAMPLE_SWEEPER_CONNINFO, else the host's conninfo.
    let sweeper_ci = std::env::var("QUEEN_EXAMPLE_SWEEPER_CONNINFO").ok().filter(|s| !s.is_empty())
        .unwrap_or_else(|| conninfo.clone());
    let config = Config::new()
        .conninfo(&sweeper_ci)
        .broker_id("example-rust-host")
        .apply_schema(true)
        .log_level("warn");
    let mut sw = Sweeper::new(&config).map_err(|e| e.to_string())?;
    let sink = Arc::clone(&fired);
    sw.on_fired(move |f| {
        // On the sweeper's thread, after the fire committed: print, note, return.
        let seen = now_ms();
        println!("on_fired: tenant={} queue={} partition={} count={} base_offset={}",
                 f.tenant, f.queue, f.partition, f.count, f.base_offset);
        if f.queue != QUEUE {
            return; // the sweeper serves the whole table, not only our queue
        }
        let mut g = sink.lock().unwrap();
        g.0.push(FiredRec { tenant: f.tenant.into(), partition: f.partition.into(), base_offset: f.base_offset,
                            seen_ms: seen });
        g.1 += u64::from(f.count);
    })
    .map_err(|e| e.to_string())?;
    sw.on_log(|level, msg| eprintln!("[sweeper {level:?}] {msg}")).map_err(|e| e.to_string())?;
    sw.start().map_err(|e| e.to_string())?;
    println!("queen-sweeper {} started", queen_sweeper::version());
    let stats = |sw: &Sweeper| sw.stats().unwrap_or_default();
    // Ready: the schema is in place and a first probe completed.
    sw.wait_ready(Duration::from_secs(30)).map_err(|e| format!("the sweeper is not ready: {e}"))?;
    println!("sweeper running, schema applied");

    let run = format!("rs-{}", now_ms());
    let rb_tag = format!("{run}-rolledback");
    let tag = format!("{run}-t");
    let mut ok = true;

    // A transaction that rolls back rings nothing.
    let before = stats(&sw);
    db.exec("BEGIN")?;
    schedule(&db, &rb_tag, 5, 100, 100)?;
    db.exec("ROLLBACK")?;
    // No wake here: the transaction did not commit, so no timer exists.
    let after = stats(&sw);
    let (w0, s0) = (stat_int(&before, "wakes_total"), stat_int(&before, "wake_signals_total"));
    let (w1, s1) = (stat_int(&after, "wakes_total"), stat_int(&after, "wake_signals_total"));
    println!("rolled back 5 timers and did NOT call wake: wakes_total {w0} -> {w1}, wake_signals_total {s0} -> {s1}");
    ok &= w0 == w1 && s0 == s1;

    // Schedule N timers in one transaction, commit, then wake.
    db.exec("BEGIN")?;
    let deliver = schedule(&db, &tag, n, 300, 2000)?;
    db.exec("COMMIT")?;
    // The wake comes only now, after COMMIT: a wake for a transaction that then rolls
    // back teaches the loop that work exists which does not.
    let earliest = *deliver.values().min().unwrap_or(&now_ms());
    sw.wake(earliest);
    let woke = stats(&sw);
    println!("committed {n} timers, then wake(earliest deliverAt {:+} ms): wakes_total {w1} -> {}, \
              wake_signals_total {s1} -> {}",
             earliest - now_ms(), stat_int(&woke, "wakes_total"), stat_int(&woke, "wake_signals_total"));

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = fired.lock().unwrap().1;
        if got >= n as u64 {
            break;
        }
        if Instant::now() > deadline {
            eprintln!("only {got} of {n} timers fired within 30 s");
            ok = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300)); // room for a duplicate to show up

    // Read each fired segment back and decode it.
    let mut worst = 0i64;
    let records: Vec<(String, String, i64, i64)> = fired
        .lock()
        .unwrap()
        .0
        .iter()
        .map(|r| (r.tenant.clone(), r.partition.clone(), r.base_offset, r.seen_ms))
        .collect();
    for (tenant, partition, base, seen) in records {
        let rows = db.query(
            "SELECT base_offset, blob, queen.epoch_ms_v1(created_at) \
               FROM queen.log_read_v1($1::uuid, $2, $3, $4::bigint, 1)",
            &[&tenant, QUEUE, &partition, &base.to_string()],
        )?;
        let Some(row) = rows.first().filter(|r| r[0].as_deref() == Some(base.to_string().as_str())) else {
            eprintln!("segment {QUEUE}/{partition}@{base} not found");
            ok = false;
            continue;
        };
        let created: i64 = row[2].as_deref().unwrap_or("0").parse().unwrap_or(0);
        let frames = decode_segment(&pq::unescape_bytea(row[1].as_deref().unwrap_or(""))).map_err(|e| e.to_string())?;
        println!("segment {QUEUE}/{partition} offsets {base}..{}:", base + frames.len() as i64 - 1);
        for fr in frames {
            match deliver.get(&fr.txn) {
                None => println!("  txn {} (not scheduled by this run)", fr.txn),
                Some(at) => {
                    let late = seen - at;
                    worst = worst.max(late);
                    println!("  txn {}  late {late} ms (on_fired - deliverAt; segment stamped {:+} ms)  payload {}",
                             fr.txn, created - at, String::from_utf8_lossy(&fr.payload));
                }
            }
        }
    }

    // Verify from the whole log of the queue: exactly once, none rolled back.
    let mut count: HashMap<&str, u32> = deliver.keys().map(|k| (k.as_str(), 0)).collect();
    let mut rb_in_log = 0;
    for p in 0..PARTITIONS {
        let rows = db.query("SELECT blob FROM queen.log_read_v1($1::uuid, $2, $3, 0, NULL)",
                            &[TENANT, QUEUE, &format!("p{p}")])?;
        for row in rows {
            for fr in decode_segment(&pq::unescape_bytea(row[0].as_deref().unwrap_or(""))).map_err(|e| e.to_string())? {
                if let Some(c) = count.get_mut(fr.txn.as_str()) {
                    *c += 1;
                } else if fr.txn.starts_with(&format!("{rb_tag}-")) {
                    rb_in_log += 1;
                }
            }
        }
    }
    let left: i64 = db
        .query("SELECT count(*) FROM queen.log_timers WHERE queue = $1 AND timer_key LIKE $2",
               &[QUEUE, &format!("{run}-%")])?[0][0]
        .as_deref()
        .unwrap_or("-1")
        .parse()
        .unwrap_or(-1);

    let stop = sw.stop(Duration::from_secs(5));
    let st = stats(&sw);
    println!("stop: {}; state {}; fired_total {}, stale_total {}, duplicate_total {}",
             stop.as_ref().map(|_| "ok".to_string()).unwrap_or_else(|e| e.to_string()),
             if st.contains("\"state\":\"stopped\"") { "stopped" } else { "?" },
             stat_int(&st, "fired_total"), stat_int(&st, "stale_total"), stat_int(&st, "duplicate_total"));
    drop(sw);

    let once = count.values().filter(|&&c| c == 1).count();
    let missing = count.values().filter(|&&c| c == 0).count();
    let dup = count.values().filter(|&&c| c > 1).count();
    ok = ok && stop.is_ok() && once == n && rb_in_log == 0 && left == 0;
    println!("summary: scheduled {n}, fired exactly once {once}, missing {missing}, duplicated {dup}, \
              rolled-back in log {rb_in_log}, left in log_timers {left}, worst lateness {worst} ms -> {}",
             if ok { "OK" } else { "FAILED" });
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("example-rust-host: {e}");
            ExitCode::FAILURE
        }
    }
}
