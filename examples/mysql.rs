//! The `transactional` example on MySQL 8 or MariaDB ≥ 10.6: orders and
//! their charge jobs enqueued in one transaction, charged exactly once by a
//! worker whose effects and completion commit together.
//!
//! ```text
//! BACKLOG_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo run --features mysql --example mysql
//! ```
//!
//! Without the URL (or the feature) it says so and exits 0. It works in a
//! database of its own, dropped at the end.

#[cfg(feature = "mysql")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use backlog::mysql::mysql::prelude::Queryable;

    let Ok(url) = std::env::var("BACKLOG_TEST_MYSQL_URL") else {
        println!("SKIPPED: set BACKLOG_TEST_MYSQL_URL to a MySQL or MariaDB database to run this example");
        return Ok(());
    };
    let database = format!("backlog_example_{}", std::process::id());
    let mut admin = backlog::mysql::mysql::Conn::new(backlog::mysql::mysql::Opts::from_url(&url)?)?;
    admin.query_drop(format!("CREATE DATABASE {database}"))?;
    // The same server and credentials, the example's database.
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let root = base.rsplit_once('/').map_or(base, |(root, _)| root);
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    let result = shop::run(&format!("{root}/{database}{query}"));
    admin.query_drop(format!("DROP DATABASE IF EXISTS {database}"))?;
    result
}

#[cfg(not(feature = "mysql"))]
fn main() {
    println!("SKIPPED: built without the mysql feature; run `cargo run --features mysql --example mysql`");
}

#[cfg(feature = "mysql")]
mod shop {
    use std::time::Duration;

    use backlog::mysql::mysql::prelude::Queryable;
    use backlog::mysql::mysql::{Conn, Opts, TxOpts};
    use backlog::mysql::{JobContextExt, QueueExt};
    use backlog::{Event, JobArgs, Queue, Worker};
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

    pub fn run(url: &str) -> Result<(), Box<dyn std::error::Error>> {
        // The only differences from SQLite: how the queue is opened, the
        // `backlog::mysql` traits, and the transaction type.
        let queue = Queue::connect(url)?;
        let events = queue.subscribe();

        let mut app = Conn::new(Opts::from_url(url)?)?;
        app.query_drop(
            "CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, cents BIGINT NOT NULL,
                                  paid BOOLEAN NOT NULL DEFAULT false)",
        )?;
        app.query_drop("CREATE TABLE charges (order_id BIGINT NOT NULL, cents BIGINT NOT NULL)")?;

        // The order and its charge job: both or neither.
        for cents in [1250_i64, 990, 4200] {
            let mut tx = app.start_transaction(TxOpts::default())?;
            tx.exec_drop("INSERT INTO orders (cents) VALUES (?)", (cents,))?;
            let order = i64::try_from(tx.last_insert_id().ok_or("no order id")?)?;
            queue.enqueue_in(&mut tx, ChargeCard { order, cents })?;
            tx.commit()?;
        }

        let worker = Worker::builder(queue.clone())
            .concurrency(2)
            .handle(|args: ChargeCard, ctx| {
                ctx.transaction(|tx| {
                    tx.exec_drop(
                        "INSERT INTO charges (order_id, cents) VALUES (?, ?)",
                        (args.order, args.cents),
                    )?;
                    tx.exec_drop("UPDATE orders SET paid = true WHERE id = ?", (args.order,))?;
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

        let rows: Vec<(i64, i64, bool, i64)> = app.query(
            "SELECT o.id, o.cents, o.paid, count(c.order_id)
             FROM orders o LEFT JOIN charges c ON c.order_id = o.id
             GROUP BY o.id, o.cents, o.paid ORDER BY o.id",
        )?;
        for (order, cents, paid, times) in rows {
            println!("order {order}: {cents} cents, paid={paid}, charged {times} time(s)");
            if times != 1 || !paid {
                return Err(format!("order {order} was charged {times} times").into());
            }
        }
        Ok(())
    }
}
