//! The `transactional` example on PostgreSQL: orders and their charge jobs
//! enqueued in one transaction, charged exactly once by a worker whose
//! effects and completion commit together.
//!
//! ```text
//! BACKLOG_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1/test \
//!     cargo run --features postgres --example postgres
//! ```
//!
//! Without the URL (or the feature) it says so and exits 0. It works in a
//! schema of its own, dropped at the end.

#[cfg(feature = "postgres")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("BACKLOG_TEST_POSTGRES_URL") else {
        println!(
            "SKIPPED: set BACKLOG_TEST_POSTGRES_URL to a PostgreSQL database to run this example"
        );
        return Ok(());
    };
    let schema = format!("backlog_example_{}", std::process::id());
    let result = shop::run(&url, &schema);
    // Clean up, whatever happened.
    let mut admin = postgres::Client::connect(&url, postgres::NoTls)?;
    admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
    result
}

#[cfg(not(feature = "postgres"))]
fn main() {
    println!("SKIPPED: built without the postgres feature; run `cargo run --features postgres --example postgres`");
}

#[cfg(feature = "postgres")]
use backlog::postgres::postgres;

#[cfg(feature = "postgres")]
mod shop {
    use std::time::Duration;

    use backlog::postgres::postgres::{Client, NoTls};
    use backlog::postgres::{JobContextExt, QueueExt};
    use backlog::{Event, JobArgs, QueueOptions, Worker};
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

    pub fn run(url: &str, schema: &str) -> Result<(), Box<dyn std::error::Error>> {
        // The only differences from SQLite: how the queue is opened, the
        // `backlog::postgres` traits, and the transaction type.
        let queue = QueueOptions::new().schema(schema).connect(url)?;
        let events = queue.subscribe();

        let mut app = Client::connect(url, NoTls)?;
        app.batch_execute(&format!(
            "CREATE TABLE {schema}.orders (id BIGSERIAL PRIMARY KEY, cents BIGINT NOT NULL,
                                           paid BOOLEAN NOT NULL DEFAULT false);
             CREATE TABLE {schema}.charges (order_id BIGINT NOT NULL, cents BIGINT NOT NULL);"
        ))?;

        // The order and its charge job: both or neither.
        for cents in [1250_i64, 990, 4200] {
            let mut tx = app.transaction()?;
            let row = tx.query_one(
                &format!("INSERT INTO {schema}.orders (cents) VALUES ($1) RETURNING id"),
                &[&cents],
            )?;
            let order: i64 = row.get(0);
            queue.enqueue_in(&mut tx, ChargeCard { order, cents })?;
            tx.commit()?;
        }

        let charges = format!("INSERT INTO {schema}.charges (order_id, cents) VALUES ($1, $2)");
        let paid = format!("UPDATE {schema}.orders SET paid = true WHERE id = $1");
        let worker = Worker::builder(queue.clone())
            .concurrency(2)
            .handle(move |args: ChargeCard, ctx| {
                ctx.transaction(|tx| {
                    tx.execute(charges.as_str(), &[&args.order, &args.cents])?;
                    tx.execute(paid.as_str(), &[&args.order])?;
                    Ok(json!({"charged_cents": args.cents}))
                })
            })
            .start()?;
        let mut completed = 0;
        while completed < 3 {
            if let Event::Completed { job_id } = events.recv_timeout(Duration::from_secs(30))? {
                println!("charged job {job_id}");
                completed += 1;
            }
        }
        worker.shutdown(Duration::from_secs(5))?;

        for row in app.query(
            &format!(
                "SELECT o.id, o.cents, o.paid, count(c.order_id)
                 FROM {schema}.orders o LEFT JOIN {schema}.charges c ON c.order_id = o.id
                 GROUP BY o.id ORDER BY o.id"
            ),
            &[],
        )? {
            let (order, cents, paid, times): (i64, i64, bool, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            println!("order {order}: {cents} cents, paid={paid}, charged {times} time(s)");
            if times != 1 || !paid {
                return Err(format!("order {order} was charged {times} times").into());
            }
        }
        Ok(())
    }
}
