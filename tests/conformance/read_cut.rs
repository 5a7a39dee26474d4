//! Reads across a broken connection: an operator's read (`get`, `list`,
//! `counts`) whose transaction loses the answer to its start returns the
//! answer from a fresh connection or an error, and never panics.
//!
//! Servers only, through the TCP proxy of `enqueue_cut.rs`. Both servers'
//! snapshot reads open with `START TRANSACTION`; the test queue's handle
//! does nothing else meanwhile, so the marker hits the read's own start.
//! On MySQL the driver's `START TRANSACTION WITH CONSISTENT SNAPSHOT`
//! unwraps its answer (mysql 28): the read must not ask for it.

use backlog::{JobFilter, JobState, NewJob};
use serde_json::json;

use crate::enqueue_cut::through_proxy;
use crate::harness::{Backend, TestResult};

fn a_read_whose_transaction_start_loses_its_answer_returns_without_panicking(
    b: &Backend,
) -> TestResult {
    let Some((_h, proxy, queue)) = through_proxy(b)? else {
        return Ok(());
    };
    let id = queue.enqueue(NewJob::new("read_cut", json!(1)))?.id;
    for round in 0..3 {
        proxy.lose_answer_to("START TRANSACTION");
        let got = queue.get(id);
        assert!(
            proxy.answer_lost(),
            "round {round}: the read's start went through the proxy"
        );
        println!("get whose transaction start lost its answer ({b:?}): {got:?}");
        // A read is retried on a fresh connection.
        assert_eq!(got?.id, id);

        proxy.lose_answer_to("START TRANSACTION");
        let listed = queue.list(&JobFilter::new(JobState::Available).queue("default"));
        assert!(
            proxy.answer_lost(),
            "round {round}: the list's start went through the proxy"
        );
        assert_eq!(listed?.jobs.len(), 1);

        proxy.lose_answer_to("START TRANSACTION");
        let counts = queue.counts();
        assert!(
            proxy.answer_lost(),
            "round {round}: the counts' start went through the proxy"
        );
        counts?;
    }
    Ok(())
}

conformance!(a_read_whose_transaction_start_loses_its_answer_returns_without_panicking);
