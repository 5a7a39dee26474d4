//! Grouped jobs on MySQL: joining a group at enqueue, and combining ready
//! groups, each group's row locked (`SKIP LOCKED` by other nodes'
//! aggregators) for the whole combination.

use mysql::prelude::Queryable;
use mysql::{params, Row};

use super::db::{take, Now};
use super::queries::Sql;
use crate::backend::params::{Aggregated, EnqueueParams, GroupParams};
use crate::error::{Error, Result};
use crate::job::Enqueued;

/// Inserts a job into its group: an id from the jobs' AUTO_INCREMENT (a
/// live row inserted and moved out in this transaction), the member row,
/// and the group's count and policy.
pub(crate) fn join(
    sql: &Sql,
    q: &mut impl Queryable,
    p: &EnqueueParams<'_>,
    g: &GroupParams<'_>,
    now: Now,
) -> Result<Enqueued> {
    let id = insert_live(sql, q, p, now)?;
    q.exec_drop(
        &sql.join_group_member,
        params! { "id" => id, "group_key" => g.key },
    )?;
    q.exec_drop(&sql.delete_live, params! { "id" => id })?;
    q.exec_drop(
        &sql.join_group,
        params! {
            "queue" => p.queue, "kind" => p.kind, "group_key" => g.key,
            "max_size" => g.max_size, "grace_us" => g.grace_us,
            "max_delay_us" => g.max_delay_us, "now" => now.param(),
        },
    )?;
    Ok(Enqueued { id, existed: false })
}

/// Inserts a live job due now without a unique key; its id.
fn insert_live(sql: &Sql, q: &mut impl Queryable, p: &EnqueueParams<'_>, now: Now) -> Result<i64> {
    let result = q.exec_iter(
        &sql.enqueue,
        params! {
            "queue" => p.queue, "kind" => p.kind, "priority" => p.priority,
            "unique_key" => Option::<&str>::None, "payload" => p.payload,
            "max_attempts" => p.max_attempts, "available_in" => 0_i64, "now" => now.param(),
        },
    )?;
    result
        .last_insert_id()
        .and_then(|id| i64::try_from(id).ok())
        .ok_or_else(|| Error::Database("insert returned no id".into()))
}

/// Combines up to `limit` ready groups this node could lock, each into one
/// job due now.
pub(crate) fn aggregate(
    sql: &Sql,
    q: &mut impl Queryable,
    now: Now,
    limit: usize,
) -> Result<Vec<Aggregated>> {
    let ready: Vec<(String, String, String, u32)> = q.exec(
        &sql.ready_groups,
        params! { "limit" => u64::try_from(limit).unwrap_or(u64::MAX), "now" => now.param() },
    )?;
    let mut done = Vec::with_capacity(ready.len());
    for (queue, kind, key, max_size) in ready {
        let group = params! { "queue" => &queue, "kind" => &kind, "group_key" => &key };
        let members: Vec<Row> = q.exec(
            &sql.group_members,
            params! {
                "queue" => &queue, "kind" => &kind, "group_key" => &key,
                "limit" => max_size,
            },
        )?;
        let mut ids = Vec::with_capacity(members.len());
        let mut payloads = Vec::with_capacity(members.len());
        let mut first: Option<(i32, u32)> = None;
        for mut m in members {
            ids.push(take::<i64>(&mut m, 0)?);
            payloads.push(take::<String>(&mut m, 2)?);
            if first.is_none() {
                first = Some((take(&mut m, 1)?, take(&mut m, 3)?));
            }
        }
        if let Some((priority, max_attempts)) = first {
            let payload = crate::group::combined_payload(payloads.iter().map(String::as_str));
            let job = EnqueueParams {
                queue: &queue,
                kind: &kind,
                priority,
                unique_key: None,
                unique_history_since: None,
                batch: None,
                unique_statuses: None,
                payload: &payload,
                max_attempts,
                available_at: 0,
                now: 0,
                group: None,
                depends_on: &[],
                sequence: None,
            };
            let job_id = insert_live(sql, q, &job, now)?;
            let ids_json = serde_json::to_string(&ids)?;
            q.exec_drop(
                &sql.aggregate_to_history,
                params! { "ids" => &ids_json, "into" => job_id, "now" => now.param() },
            )?;
            q.exec_drop(&sql.delete_aggregated, params! { "ids" => &ids_json })?;
            super::counts::count_moved(sql, q, &ids)?;
            done.push(Aggregated {
                job_id,
                queue: queue.clone(),
                kind: kind.clone(),
                members: ids.len(),
            });
        }
        let left: Option<(i64, Option<i64>)> = q.exec_first(&sql.group_left, group.clone())?;
        match left {
            Some((count, Some(oldest))) if count > 0 => q.exec_drop(
                &sql.rearm_group,
                params! {
                    "queue" => &queue, "kind" => &kind, "group_key" => &key,
                    "size" => count, "first_at" => oldest, "now" => now.param(),
                },
            )?,
            _ => q.exec_drop(&sql.delete_group, group)?,
        }
    }
    Ok(done)
}

/// How long after now the next group is ready (0 when one is), in µs.
pub(crate) fn next_ready(sql: &Sql, q: &mut impl Queryable, now: Now) -> Result<Option<i64>> {
    let due: Option<Option<i64>> =
        q.exec_first(&sql.next_group_ready, params! { "now" => now.param() })?;
    Ok(due.flatten().map(|d| d.max(0)))
}
