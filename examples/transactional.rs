//! Exactly-once effects: an orders table and a charge job that records the
//! charge and completes itself in one transaction (`ctx.transaction`).
//!
//! A worker that hangs past its lease cannot charge a second time: by the
//! time it wakes up the job was rescued and charged by another worker, its
//! lease token no longer matches, and its transaction rolls back with
//! `LeaseLost`. A crash before the commit rolls back both the charge and the
//! completion, so the job simply runs again. Run with
//! `cargo run --example transactional`.

use std::time::Duration;

use backlog::sqlite::{JobContextExt, QueueExt};
use backlog::{Error, Event, JobArgs, LeaseRequest, Queue, Worker};
use rusqlite::{Connection, TransactionBehavior};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize)]
struct ChargeCard {
    order: i64,
    cents: i64,
}

impl JobArgs for ChargeCard {
    const KIND: &'static str = "charge_card";
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shop.db");
    let queue = Queue::open(&path)?;
    let events = queue.subscribe();

    // The application's own tables live in the same file as the queue.
    let mut app = Connection::open(&path)?;
    app.busy_timeout(Duration::from_secs(5))?;
    app.execute_batch(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, cents INTEGER NOT NULL, paid INTEGER NOT NULL DEFAULT 0);
         CREATE TABLE charges (order_id INTEGER NOT NULL, cents INTEGER NOT NULL, charged_by TEXT NOT NULL);",
    )?;

    // Placing an order enqueues its charge in the same transaction: the job
    // exists if and only if the order does.
    for cents in [1250, 990, 4200] {
        let tx = app.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute("INSERT INTO orders (cents) VALUES (?1)", [cents])?;
        let order = tx.last_insert_rowid();
        queue.enqueue_in(&tx, ChargeCard { order, cents })?;
        tx.commit()?;
    }

    // A worker claims the first charge and then hangs past its short lease.
    let stale =
        queue.lease(&LeaseRequest::new("hung-worker", 1).ttl(Duration::from_millis(200)))?;
    let stale_job = stale.first().ok_or("nothing to lease")?;
    println!(
        "hung-worker claimed job {} and stopped responding",
        stale_job.id
    );
    std::thread::sleep(Duration::from_millis(300)); // the lease expires meanwhile

    // A healthy worker rescues the expired lease and charges every order once.
    let worker = Worker::builder(queue.clone())
        .worker_id("healthy-worker")
        .rescue_interval(Duration::from_millis(100))
        .handle(|args: ChargeCard, ctx| {
            ctx.transaction(|tx| {
                tx.execute(
                    "INSERT INTO charges (order_id, cents, charged_by) VALUES (?1, ?2, 'healthy-worker')",
                    [args.order, args.cents],
                )?;
                tx.execute("UPDATE orders SET paid = 1 WHERE id = ?1", [args.order])?;
                Ok(json!({"charged_cents": args.cents}))
            })
        })
        .start()?;
    let mut completed = 0;
    while completed < 3 {
        if let Event::Completed { job_id } = events.recv_timeout(Duration::from_secs(30))? {
            println!("healthy-worker charged job {job_id}");
            completed += 1;
        }
    }
    worker.shutdown(Duration::from_secs(5))?;

    // The hung worker wakes up and tries to charge: fence first, then effects.
    let args: ChargeCard = stale_job.args()?;
    let late = queue.transaction(|tx| {
        queue.complete_in(tx, stale_job, None)?;
        tx.execute(
            "INSERT INTO charges (order_id, cents, charged_by) VALUES (?1, ?2, 'hung-worker')",
            [args.order, args.cents],
        )?;
        Ok::<(), Error>(())
    });
    match late {
        Err(e) if e.is_lease_lost() => {
            println!("hung-worker woke up: {e}; its transaction rolled back, nothing charged")
        }
        other => return Err(format!("the stale charge was not refused: {other:?}").into()),
    }

    println!("\ncharges per order:");
    let mut stmt = app.prepare(
        "SELECT o.id, o.cents, o.paid, count(c.order_id), group_concat(c.charged_by)
         FROM orders o LEFT JOIN charges c ON c.order_id = o.id GROUP BY o.id ORDER BY o.id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, bool>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, String>(4)?,
        ))
    })?;
    for row in rows {
        let (order, cents, paid, charges, by) = row?;
        println!("order {order}: {cents} cents, paid={paid}, charged {charges} time(s) by {by}");
        if charges != 1 {
            return Err(format!("order {order} was charged {charges} times").into());
        }
    }
    Ok(())
}
