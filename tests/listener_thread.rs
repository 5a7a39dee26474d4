//! PostgreSQL's listener reads its connection on a thread of its own
//! (`backlog-listen`): the thread ends when its worker shuts down, and the
//! worker's shutdown does not wait on it for long. Alone in its binary, so
//! no other test's listeners are counted.
//!
//! Runs when `BACKLOG_TEST_POSTGRES_URL` is set and the `postgres` feature
//! is built; otherwise prints `SKIPPED`.

#[path = "conformance/harness.rs"]
#[macro_use]
mod harness;

use std::time::{Duration, Instant};

use backlog::{QueueOptions, Worker};
use serde_json::Value;

use harness::{Backend, TestResult};

/// How many threads of this process bear `name`.
fn threads_named(name: &str) -> TestResult<usize> {
    let mut n = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        let comm = std::fs::read_to_string(task?.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            n += 1;
        }
    }
    Ok(n)
}

fn the_listener_thread_ends_with_its_worker(b: &Backend) -> TestResult {
    if *b != Backend::Postgres {
        return Ok(()); // only PostgreSQL listens
    }
    let h = b.harness_on_real_time(QueueOptions::new())?;
    let worker = Worker::builder(h.queue.clone())
        .handle_raw("k", |_: Value, _| Ok(()))
        .start()?;
    // A new thread names itself once it runs: look for a moment.
    let mut listening = false;
    for _ in 0..200 {
        listening = threads_named("backlog-listen")? >= 1;
        if listening {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(listening, "no listener thread");
    let start = Instant::now();
    worker.shutdown(Duration::from_secs(5))?;
    // A correctness bound, far above the listener's 50 ms read slice.
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(
        threads_named("backlog-listen")?,
        0,
        "a listener outlived its worker"
    );
    Ok(())
}

#[test]
fn postgres_the_listener_thread_ends_with_its_worker() -> TestResult {
    Backend::Postgres.run(the_listener_thread_ends_with_its_worker)
}
