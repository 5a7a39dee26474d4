//! The turnstile (processes take turns at a SQLite file's write lock, see
//! src/backend/sqlite/write_path/turnstile.rs) and dead processes: a process killed
//! with SIGKILL while it holds its turn, or while it waits for one, keeps
//! nobody waiting, and a turn held past the write deadline is `Error::Busy`,
//! never a hang.
//!
//! SQLite only: the turnstile is how SQLite writers queue; the servers queue
//! writers themselves.

mod worker_common;

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::time::{Duration, Instant};

use backlog::sqlite::QueueExt;
use backlog::{Error, NewJob, QueueOptions};
use serde_json::json;
use worker_common::*;

/// The queues' write deadline here: every wait must end by it.
const DEADLINE: Duration = Duration::from_secs(10);

/// Reads the child's stdout until a line equal to `line`.
fn wait_for_line(
    child: &mut Child,
    line: &str,
) -> TestResult<BufReader<std::process::ChildStdout>> {
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut reader = BufReader::new(stdout);
    let mut text = String::new();
    loop {
        text.clear();
        if reader.read_line(&mut text)? == 0 {
            return Err(format!("the child ended before printing {line:?}").into());
        }
        if text.trim_end().ends_with(line) {
            return Ok(reader);
        }
    }
}

fn live_jobs(db: &Db) -> TestResult<i64> {
    Ok(db
        .connect()?
        .query_row("SELECT count(*) FROM backlog_jobs", [], |r| r.get(0))?)
}

fn options() -> QueueOptions {
    QueueOptions::new().write_deadline(DEADLINE)
}

#[test]
fn a_process_killed_holding_its_turn_keeps_nobody_waiting() -> TestResult {
    const TEST: &str = "a_process_killed_holding_its_turn_keeps_nobody_waiting";
    if let Some((_, path)) = child_role() {
        let queue = options().open(path)?;
        queue.transaction(|tx| -> Result<(), Error> {
            tx.execute_batch("CREATE TABLE held (x INTEGER)")?;
            println!("holding");
            std::thread::sleep(PATIENCE); // killed here
            Ok(())
        })?;
        return Ok(());
    }
    let db = Db::new()?;
    let queue = db.queue_with(options())?;
    let mut holder = spawn_child(TEST, "holder", &db)?;
    let _out = wait_for_line(&mut holder, "holding")?;

    let waiting = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            let began = Instant::now();
            let done = queue.enqueue(NewJob::new("k", json!(1)));
            (done, began.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !waiting.is_finished(),
        "the enqueue did not wait for the holder"
    );
    let killed = Instant::now();
    holder.kill()?;
    holder.wait()?;
    let (done, waited) = waiting.join().map_err(|_| "enqueue thread panicked")?;
    done?;
    assert!(waited < DEADLINE, "waited {waited:?}");
    assert!(
        killed.elapsed() < DEADLINE / 2,
        "the enqueue went on waiting {:?} after the holder died",
        killed.elapsed()
    );
    queue.enqueue(NewJob::new("k", json!(2)))?;
    assert_eq!(live_jobs(&db)?, 2);
    Ok(())
}

#[test]
fn a_process_killed_waiting_for_its_turn_keeps_nobody_waiting() -> TestResult {
    const TEST: &str = "a_process_killed_waiting_for_its_turn_keeps_nobody_waiting";
    if let Some((_, path)) = child_role() {
        let queue = options().open(path)?;
        println!("enqueuing");
        queue.enqueue(NewJob::new("k", json!("child")))?; // killed waiting here
        println!("enqueued");
        std::thread::sleep(PATIENCE);
        return Ok(());
    }
    let db = Db::new()?;
    let queue = db.queue_with(options())?;
    // This process holds the turn while the child queues behind it.
    let (release, released) = crossbeam_channel::bounded::<()>(0);
    let holder = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            queue.transaction(|_tx| -> Result<(), Error> {
                let _ = released.recv_timeout(PATIENCE);
                Ok(())
            })
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut waiter = spawn_child(TEST, "waiter", &db)?;
    let mut out = wait_for_line(&mut waiter, "enqueuing")?;
    // Time to open its turnstile and block in the kernel behind us.
    std::thread::sleep(Duration::from_millis(500));
    waiter.kill()?;
    waiter.wait()?;
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest)?;
    assert!(!rest.contains("enqueued"), "the child was not kept waiting");
    release.send(())?;
    holder.join().map_err(|_| "holder thread panicked")??;

    // Another process's queue (a second handle has its own turnstile file
    // description, just the same) gets its turn at once.
    let other = db.queue_with(options())?;
    let began = Instant::now();
    other.enqueue(NewJob::new("k", json!("after")))?;
    queue.enqueue(NewJob::new("k", json!("after")))?;
    assert!(began.elapsed() < DEADLINE / 2, "took {:?}", began.elapsed());
    assert_eq!(live_jobs(&db)?, 2, "the killed enqueue wrote nothing");
    Ok(())
}

#[test]
fn a_turn_held_past_the_write_deadline_is_busy_not_a_hang() -> TestResult {
    let db = Db::new()?;
    let holder_queue = db.queue()?;
    let deadline = Duration::from_millis(500);
    let queue = db.queue_with(QueueOptions::new().write_deadline(deadline))?;
    let (release, released) = crossbeam_channel::bounded::<()>(0);
    let (held, holding) = crossbeam_channel::bounded::<()>(1);
    let holder = std::thread::spawn(move || {
        holder_queue.transaction(|_tx| -> Result<(), Error> {
            let _ = held.send(());
            let _ = released.recv_timeout(PATIENCE);
            Ok(())
        })
    });
    holding.recv_timeout(PATIENCE)?;
    for _ in 0..2 {
        let began = Instant::now();
        let done = queue.enqueue(NewJob::new("k", json!(1)));
        assert!(matches!(done, Err(Error::Busy)), "{done:?}");
        assert!(began.elapsed() < deadline * 4, "took {:?}", began.elapsed());
    }
    release.send(())?;
    holder.join().map_err(|_| "holder thread panicked")??;
    // The turn the queue's helper got after giving up was let go (or is
    // handed to this enqueue).
    queue.enqueue(NewJob::new("k", json!(2)))?;
    Ok(())
}
