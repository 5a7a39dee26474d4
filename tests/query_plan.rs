//! The lease statement walks the lease indexes in claim order and stops after
//! n rows: no table scan, and no sort except the merge of the small
//! per-walk candidate lists. One walk per queue (`backlog_jobs_lease`), or
//! per queue and kind when the lease names kinds (`backlog_jobs_lease_kind`,
//! a seek: jobs of other kinds are never walked); both indexes hold only due,
//! unleased jobs (jobs waiting for their time are in
//! `backlog_jobs_scheduled`), and paused queues are left out before the walk.
//! Checked on a database with a few thousand rows, before and after
//! `ANALYZE`, so the planner's choice is realistic.

mod common;

use std::time::Duration;

use backlog::{LeaseRequest, NewJob};
use common::{Harness, TestResult};
use serde_json::json;

const WALK: &str = "SEARCH backlog_jobs USING INDEX backlog_jobs_lease (queue=?)";
const KIND_WALK: &str =
    "SEARCH backlog_jobs USING INDEX backlog_jobs_lease_kind (queue=? AND kind=?)";
const SORT: &str = "USE TEMP B-TREE";

/// One node of an `EXPLAIN QUERY PLAN` tree, read back from its indentation.
#[derive(Debug)]
struct Node {
    detail: String,
    parent: Option<usize>,
}

fn parse(lines: &[String]) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut path: Vec<usize> = Vec::new(); // the open ancestors, by depth
    for line in lines {
        let depth = (line.len() - line.trim_start().len()) / 2;
        path.truncate(depth);
        nodes.push(Node {
            detail: line.trim().to_owned(),
            parent: path.last().copied(),
        });
        path.push(nodes.len() - 1);
    }
    nodes
}

fn children(nodes: &[Node], parent: usize) -> Vec<&str> {
    nodes
        .iter()
        .filter(|n| n.parent == Some(parent))
        .map(|n| n.detail.as_str())
        .collect()
}

/// A database with thousands of live rows over three busy queues, one tiny
/// one, several kinds and priorities, some leased and some scheduled.
fn busy_queue() -> TestResult<Harness> {
    let h = Harness::new()?;
    let queues = ["q1", "q2", "q3"];
    h.queue.enqueue_many((0..3000).map(|i| {
        let job = NewJob::new(["email", "resize", "report"][i % 3], json!({ "i": i }))
            .queue(queues[i % 3])
            .priority((i % 7) as i32 - 3);
        if i % 4 == 0 {
            job.delay(Duration::from_secs(3600))
        } else {
            job
        }
    }))?;
    h.queue
        .enqueue_many((0..5).map(|i| NewJob::new("email", json!(i)).queue("tiny")))?;
    for queue in queues {
        h.queue
            .lease(&LeaseRequest::new("w", 200).queues([queue]))?;
    }
    Ok(h)
}

fn explain(h: &Harness, request: &LeaseRequest) -> TestResult<Vec<String>> {
    Ok(h.queue.explain_lease(request)?)
}

/// One walk: the walk of a lease index is the whole plan, no sort.
fn assert_single_walk_plan(plan: &[String], walk: &str) {
    let text = plan.join("\n");
    assert_eq!(
        plan.iter().filter(|l| l.trim() == walk).count(),
        1,
        "expected one walk {walk}:\n{text}"
    );
    assert!(!text.contains(SORT), "a sort in a one-queue lease:\n{text}");
    assert!(
        !text.contains("SCAN backlog_jobs"),
        "a scan of backlog_jobs:\n{text}"
    );
    // The claimed rows are updated by primary key.
    assert_eq!(
        plan.first().map(|l| l.trim()),
        Some("SEARCH backlog_jobs USING INTEGER PRIMARY KEY (rowid=?)"),
        "{text}"
    );
}

/// Several walks: one index walk per queue (or queue and kind), no sort
/// inside any walk, and exactly one sort: the ORDER BY of the merge of the
/// walks' outputs (at most limit × walks rows).
fn assert_merged_plan(plan: &[String], walk: &str, count: usize) {
    let text = plan.join("\n");
    let nodes = parse(plan);
    assert!(
        !text.contains("SCAN backlog_jobs"),
        "a scan of backlog_jobs:\n{text}"
    );

    let walks: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].detail == walk)
        .collect();
    assert_eq!(walks.len(), count, "one index walk each:\n{text}");

    let sorts: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].detail.starts_with(SORT))
        .collect();
    assert_eq!(sorts.len(), 1, "exactly one sort, the merge:\n{text}");
    let sort = sorts[0];
    assert_eq!(nodes[sort].detail, "USE TEMP B-TREE FOR ORDER BY", "{text}");

    // The sort's siblings: a co-routine holding the UNION ALL of the walks,
    // and the scan of that co-routine's output. Nothing else is sorted.
    let parent = nodes[sort].parent.expect("the sort has a parent");
    let siblings = children(&nodes, parent);
    let merge = (0..nodes.len())
        .find(|&i| nodes[i].parent == Some(parent) && nodes[i].detail.starts_with("CO-ROUTINE"))
        .unwrap_or_else(|| panic!("no merge co-routine beside the sort:\n{text}"));
    let merged_name = nodes[merge]
        .detail
        .trim_start_matches("CO-ROUTINE ")
        .to_owned();
    assert_eq!(
        siblings,
        vec![
            nodes[merge].detail.as_str(),
            &format!("SCAN {merged_name}"),
            "USE TEMP B-TREE FOR ORDER BY"
        ],
        "{text}"
    );
    assert_eq!(
        children(&nodes, merge),
        vec!["COMPOUND QUERY"],
        "the merge is a compound of the walks:\n{text}"
    );
    // Every walk lies under the merge's compound query.
    for &walk in &walks {
        let mut at = walk;
        while let Some(up) = nodes[at].parent {
            if up == merge {
                break;
            }
            at = up;
        }
        assert_eq!(
            nodes[at].parent,
            Some(merge),
            "walk outside the merge:\n{text}"
        );
    }
}

#[test]
fn lease_of_one_queue_walks_the_lease_index_without_a_sort() -> TestResult {
    let h = busy_queue()?;
    for analyzed in [false, true] {
        if analyzed {
            h.raw()?.execute_batch("ANALYZE")?;
        }
        for queue in ["q1", "tiny", "missing"] {
            let any_kind = explain(&h, &LeaseRequest::new("w", 10).queues([queue]))?;
            assert_single_walk_plan(&any_kind, WALK);
            let one_kind = explain(
                &h,
                &LeaseRequest::new("w", 10).queues([queue]).kinds(["email"]),
            )?;
            assert_single_walk_plan(&one_kind, KIND_WALK);
        }
    }
    Ok(())
}

#[test]
fn lease_of_several_queues_or_kinds_walks_each_and_sorts_only_the_merge() -> TestResult {
    let h = busy_queue()?;
    for analyzed in [false, true] {
        if analyzed {
            h.raw()?.execute_batch("ANALYZE")?;
        }
        let two = LeaseRequest::new("w", 10).queues(["q1", "tiny"]);
        assert_merged_plan(&explain(&h, &two)?, WALK, 2);
        let three = LeaseRequest::new("w", 50).queues(["q1", "q2", "q3"]);
        assert_merged_plan(&explain(&h, &three)?, WALK, 3);
        let kinds = LeaseRequest::new("w", 10)
            .queues(["q1"])
            .kinds(["email", "report"]);
        assert_merged_plan(&explain(&h, &kinds)?, KIND_WALK, 2);
        let with_kinds = LeaseRequest::new("w", 10)
            .queues(["q1", "q2", "q3", "tiny"])
            .kinds(["resize"]);
        assert_merged_plan(&explain(&h, &with_kinds)?, KIND_WALK, 4);
    }
    Ok(())
}

#[test]
fn a_paused_queue_is_not_walked_at_all() -> TestResult {
    let h = busy_queue()?;
    h.queue.pause("q2")?;
    let plan = explain(&h, &LeaseRequest::new("w", 10).queues(["q1", "q2"]))?;
    assert_single_walk_plan(&plan, WALK);
    let plan = explain(&h, &LeaseRequest::new("w", 10).queues(["q2"]))?;
    assert!(
        plan.is_empty(),
        "a lease of paused queues runs no statement: {plan:?}"
    );
    Ok(())
}

#[test]
fn the_next_due_job_is_found_by_a_seek_of_the_waiting_jobs() -> TestResult {
    let h = busy_queue()?;
    for analyzed in [false, true] {
        if analyzed {
            h.raw()?.execute_batch("ANALYZE")?;
        }
        let plan: Vec<String> = {
            let conn = h.raw()?;
            let mut stmt = conn.prepare(
                "EXPLAIN QUERY PLAN SELECT min(available_at) FROM backlog_jobs
                 WHERE lease_token IS NULL AND NOT due
                   AND queue IN (SELECT value FROM json_each(?1))",
            )?;
            let rows = stmt.query_map(["[\"q1\"]"], |r| r.get::<_, String>(3))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let text = plan.join("\n");
        assert!(
            text.contains("backlog_jobs_scheduled"),
            "the next-due query does not use backlog_jobs_scheduled:\n{text}"
        );
        assert!(!text.contains("SCAN backlog_jobs"), "{text}");
    }
    Ok(())
}

#[test]
fn explaining_a_lease_claims_nothing() -> TestResult {
    let h = busy_queue()?;
    let before = h.queue.counts()?;
    explain(&h, &LeaseRequest::new("w", 10).queues(["q1", "q2"]))?;
    assert_eq!(h.queue.counts()?, before);
    Ok(())
}
