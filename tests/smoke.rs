use backlog::{LeaseRequest, NewJob, Queue};
use serde_json::json;

#[test]
fn smoke() -> backlog::Result<()> {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(dir.path().join("q.db"))?;
    let a = q.enqueue(NewJob::new("k", json!({"n": 1})).unique_key("u"))?;
    let b = q.enqueue(NewJob::new("k", json!({"n": 2})).unique_key("u"))?;
    assert!(!a.existed && b.existed && a.id == b.id);
    q.enqueue_many((0..3).map(|i| NewJob::new("k", json!(i)).priority(i)))?;
    q.enqueue(NewJob::new("k", json!(9)).queue("other"))?;
    let jobs = q.lease(
        &LeaseRequest::new("w", 10)
            .queues(["default", "other"])
            .kinds(["k"]),
    )?;
    assert_eq!(jobs.len(), 5);
    println!(
        "{:?}",
        jobs.iter().map(|j| (j.id, j.priority)).collect::<Vec<_>>()
    );
    q.complete(&jobs[0], Some(json!("ok")))?;
    q.fail(&jobs[1], "boom")?;
    let hb = q.heartbeat(
        &[jobs[2].lease(), jobs[0].lease()],
        std::time::Duration::from_secs(5),
    )?;
    assert_eq!(hb.lost, vec![jobs[0].lease()]);
    println!("{:?}", q.counts()?);
    println!("{:?}", q.get(jobs[1].id)?);
    Ok(())
}
