//! An idle worker sleeps: measure the CPU a started worker with nothing to do
//! uses over five seconds and print it. Only a generous sanity bound is
//! asserted; the figure is for the record.

mod worker_common;

use std::time::{Duration, Instant};

use backlog::Worker;
use worker_common::*;

/// User + system CPU time of this whole process.
fn cpu_time() -> TestResult<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage only writes the struct it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: initialised by the successful call above.
    let usage = unsafe { usage.assume_init() };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Ok(Duration::from_micros(
        micros(usage.ru_utime) + micros(usage.ru_stime),
    ))
}

#[test]
fn an_idle_worker_uses_almost_no_cpu() -> TestResult {
    let db = Db::new()?;
    let queue = db.queue()?;
    let worker = Worker::builder(queue.clone())
        .handle(|_: Work, _| Ok(()))
        .start()?;
    // Let the start-up work (first lease, first maintenance pass) pass.
    std::thread::sleep(Duration::from_millis(500));

    let (cpu_before, wall_before) = (cpu_time()?, Instant::now());
    std::thread::sleep(Duration::from_secs(5)); // the measurement window
    let (cpu, wall) = (cpu_time()? - cpu_before, wall_before.elapsed());
    worker.shutdown(PATIENCE)?;

    let share = cpu.as_secs_f64() / wall.as_secs_f64() * 100.0;
    println!(
        "idle worker (8 threads, default settings): {:.1} ms CPU over {:.2} s = {share:.3} % of one core",
        cpu.as_secs_f64() * 1e3,
        wall.as_secs_f64()
    );
    assert!(
        share < 10.0,
        "an idle worker should sleep, used {share:.1} %"
    );
    Ok(())
}
